package diagnostics

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// apiServer answers TokenReviews and SubjectAccessReviews as the API server would for
// the tokens and grants it knows, and counts them.
type apiServer struct {
	authenticationclient.TokenReviewInterface
	authorizationclient.SubjectAccessReviewInterface

	mu       sync.Mutex
	users    map[string]authenticationv1.UserInfo // token → user
	allowed  map[string]bool                      // "user verb path"
	fail     error
	tokenRev int
	sars     []authorizationv1.SubjectAccessReviewSpec
}

func (a *apiServer) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tokenRev++
	if a.fail != nil {
		return nil, a.fail
	}
	out := tr.DeepCopy()
	if u, ok := a.users[tr.Spec.Token]; ok {
		out.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: u}
	} else {
		out.Status = authenticationv1.TokenReviewStatus{Error: "[invalid bearer token, token lookup failed]"}
	}
	return out, nil
}

// sarClient is the SubjectAccessReview half of apiServer (both have a Create method).
type sarClient struct{ *apiServer }

func (s sarClient) Create(_ context.Context, sar *authorizationv1.SubjectAccessReview, _ metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error) {
	a := s.apiServer
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sars = append(a.sars, sar.Spec)
	out := sar.DeepCopy()
	attrs := sar.Spec.NonResourceAttributes
	out.Status.Allowed = attrs != nil && a.allowed[sar.Spec.User+" "+attrs.Verb+" "+attrs.Path]
	return out, nil
}

func (a *apiServer) counts() (int, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tokenRev, len(a.sars)
}

const (
	scraperToken = "eyJhbGciOiJSUzI1NiJ9.scraper-token-value"
	scraperUser  = "system:serviceaccount:monitoring:prometheus"
)

// A scraper's requests are reviewed by the API server once, then served from the
// remembered reviews until they expire; refusals are 401 and 403 with the user named;
// a failing review is a 500; no token ever reaches the log.
func TestReviewedRequests(t *testing.T) {
	g := NewWithT(t)
	api := &apiServer{
		users: map[string]authenticationv1.UserInfo{scraperToken: {
			Username: scraperUser, Groups: []string{"system:serviceaccounts"},
			Extra: map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"prometheus-0"}},
		}},
		allowed: map[string]bool{scraperUser + " get /metrics": true},
	}
	clk := clocktesting.NewFakePassiveClock(time.Now())
	var logs strings.Builder
	var logMu sync.Mutex
	log := funcr.New(func(prefix, args string) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintln(&logs, prefix, args)
	}, funcr.Options{Verbosity: 10})
	served := 0
	h, err := newReviewer(api, sarClient{api}, clk).filter(log, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served++
		_, _ = w.Write([]byte("metrics"))
	}))
	g.Expect(err).NotTo(HaveOccurred())
	do := func(method, path, authorization string) (int, string) {
		req := httptest.NewRequest(method, path, http.NoBody)
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}

	code, _ := do(http.MethodGet, "/metrics", "")
	g.Expect(code).To(Equal(http.StatusUnauthorized))
	code, _ = do(http.MethodGet, "/metrics", "Basic dXNlcjpwYXNz")
	g.Expect(code).To(Equal(http.StatusUnauthorized))
	g.Expect(api.counts()).To(BeZero(), "a request without a bearer token needs no review")

	code, _ = do(http.MethodGet, "/metrics", "Bearer unknown-token-value")
	g.Expect(code).To(Equal(http.StatusUnauthorized))
	code, _ = do(http.MethodGet, "/metrics", "Bearer unknown-token-value")
	g.Expect(code).To(Equal(http.StatusUnauthorized))
	reviews, _ := api.counts()
	g.Expect(reviews).To(Equal(1), "an unknown token is remembered for a while")

	code, body := do(http.MethodGet, "/metrics", "Bearer "+scraperToken)
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(body).To(Equal("metrics"))
	g.Expect(api.sars).To(ConsistOf(authorizationv1.SubjectAccessReviewSpec{
		User: scraperUser, Groups: []string{"system:serviceaccounts"},
		Extra:                 map[string]authorizationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"prometheus-0"}},
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
	}))
	code, body = do(http.MethodPut, "/metrics", "bearer  "+scraperToken+" ")
	g.Expect(code).To(Equal(http.StatusForbidden), "the scraper may get, not put")
	g.Expect(body).To(ContainSubstring("Authorization denied for user " + scraperUser))
	code, _ = do(http.MethodGet, "/debug/pprof/heap", "Bearer "+scraperToken)
	g.Expect(code).To(Equal(http.StatusForbidden))
	g.Expect(served).To(Equal(1))

	for range 3 {
		code, _ = do(http.MethodGet, "/metrics", "Bearer "+scraperToken)
		g.Expect(code).To(Equal(http.StatusOK))
	}
	reviews, sars := api.counts()
	g.Expect([]int{reviews, sars}).To(Equal([]int{2, 3}), "scrapes within a minute need no new review")

	// A token is reviewed again after a minute, a decision after five.
	clk.SetTime(clk.Now().Add(61 * time.Second))
	code, _ = do(http.MethodGet, "/metrics", "Bearer "+scraperToken)
	g.Expect(code).To(Equal(http.StatusOK))
	reviews, sars = api.counts()
	g.Expect([]int{reviews, sars}).To(Equal([]int{3, 3}))
	clk.SetTime(clk.Now().Add(5 * time.Minute))
	api.allowed = nil // the grant was taken away
	code, _ = do(http.MethodGet, "/metrics", "Bearer "+scraperToken)
	g.Expect(code).To(Equal(http.StatusForbidden))

	// The API server cannot be asked: a 500, logged without the token.
	api.fail = errors.New("connection refused")
	code, body = do(http.MethodGet, "/metrics", "Bearer another-token-value")
	g.Expect(code).To(Equal(http.StatusInternalServerError))
	g.Expect(body).NotTo(ContainSubstring("another-token-value"))

	g.Expect(logs.String()).To(And(ContainSubstring("Authorization denied"), ContainSubstring("connection refused")))
	for _, token := range []string{scraperToken, "unknown-token-value", "another-token-value", "dXNlcjpwYXNz"} {
		g.Expect(logs.String()).NotTo(ContainSubstring(token))
	}
}

func TestBearerToken(t *testing.T) {
	for header, want := range map[string]string{
		"Bearer abc":    "abc",
		"bearer abc":    "abc",
		" Bearer  abc ": "abc",
		"Bearer":        "",
		"Bearer ":       "",
		"Basic abc":     "",
		"Bearer a b":    "",
		"":              "",
	} {
		got, ok := bearerToken(header)
		if got != want && ok || ok != (want != "") {
			t.Errorf("bearerToken(%q) = %q, %v; want %q", header, got, ok, want)
		}
	}
}
