package diagnostics

import (
	"context"
	"errors"
	"fmt"
	"net"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// apiServer answers TokenReviews and SubjectAccessReviews as the API server would for
// the tokens and grants it knows, and counts them.
type apiServer struct {
	authenticationclient.TokenReviewInterface
	authorizationclient.SubjectAccessReviewInterface

	mu      sync.Mutex
	users   map[string]authenticationv1.UserInfo // token → user
	allowed map[string]bool                      // "user verb path"
	// tokenErrs and sarErrs fail the next reviews, one error each.
	tokenErrs, sarErrs []error
	tokenRev           int
	sars               []authorizationv1.SubjectAccessReviewSpec
}

// next pops the next error of errs.
func next(errs *[]error) error {
	if len(*errs) == 0 {
		return nil
	}
	err := (*errs)[0]
	*errs = (*errs)[1:]
	return err
}

func (a *apiServer) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tokenRev++
	if err := next(&a.tokenErrs); err != nil {
		return nil, err
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
	if err := next(&a.sarErrs); err != nil {
		return nil, err
	}
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
	scraperToken  = "eyJhbGciOiJSUzI1NiJ9.scraper-token-value"
	scraperUser   = "system:serviceaccount:monitoring:prometheus"
	strangerToken = "eyJhbGciOiJSUzI1NiJ9.stranger-token-value"
	strangerUser  = "system:serviceaccount:default:stranger"
)

// A scraper's requests are reviewed by the API server once, then served from the
// remembered reviews until they expire; refusals are 401 and 403 with the user named;
// a review that fails for a passing reason is tried again, one that keeps failing is a
// 500; the handlers never see the token, and no token ever reaches the log.
func TestReviewedRequests(t *testing.T) {
	g := NewWithT(t)
	api := &apiServer{
		users: map[string]authenticationv1.UserInfo{
			scraperToken: {
				Username: scraperUser, Groups: []string{"system:serviceaccounts"},
				Extra: map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"prometheus-0"}},
			},
			strangerToken: {Username: strangerUser, Groups: []string{"system:serviceaccounts", "system:authenticated"}},
		},
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
	served, sawCredentials := 0, false
	fast := wait.Backoff{Duration: time.Millisecond, Factor: 1.5, Steps: 5}
	h, err := newReviewer(api, sarClient{api}, clk, fast).filter(log, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		served++
		sawCredentials = sawCredentials || req.Header.Get("Authorization") != ""
		_, _ = w.Write([]byte("metrics"))
	}))
	g.Expect(err).NotTo(HaveOccurred())
	do := func(method, path, token string) (int, string) {
		req := httptest.NewRequest(method, path, http.NoBody)
		if token != "" {
			req.Header.Set("Authorization", token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	counts := func() []int { r, s := api.counts(); return []int{r, s} }
	bearer := func(token string) string { return "Bearer " + token }

	code, _ := do(http.MethodGet, "/metrics", "")
	g.Expect(code).To(Equal(http.StatusUnauthorized))
	code, _ = do(http.MethodGet, "/metrics", "Basic dXNlcjpwYXNz")
	g.Expect(code).To(Equal(http.StatusUnauthorized))
	g.Expect(counts()).To(Equal([]int{0, 0}), "a request without a bearer token needs no review")

	code, _ = do(http.MethodGet, "/metrics", bearer("unknown-token-value"))
	g.Expect(code).To(Equal(http.StatusUnauthorized))
	code, _ = do(http.MethodGet, "/metrics", bearer("unknown-token-value"))
	g.Expect(code).To(Equal(http.StatusUnauthorized))
	g.Expect(counts()).To(Equal([]int{1, 0}), "an unknown token is remembered for 10 s")
	clk.SetTime(clk.Now().Add(11 * time.Second))
	code, _ = do(http.MethodGet, "/metrics", bearer("unknown-token-value"))
	g.Expect(code).To(Equal(http.StatusUnauthorized))
	g.Expect(counts()).To(Equal([]int{2, 0}), "and reviewed again after 10 s")

	code, body := do(http.MethodGet, "/metrics", bearer(scraperToken))
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(body).To(Equal("metrics"))
	g.Expect(sawCredentials).To(BeFalse(), "the handler does not get the token")
	g.Expect(api.sars).To(ConsistOf(authorizationv1.SubjectAccessReviewSpec{
		User: scraperUser, Groups: []string{"system:serviceaccounts", "system:authenticated"},
		Extra:                 map[string]authorizationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"prometheus-0"}},
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
	}))
	code, body = do(http.MethodPut, "/metrics", "bearer  "+scraperToken+" ")
	g.Expect(code).To(Equal(http.StatusForbidden), "the scraper may get, not put")
	g.Expect(body).To(ContainSubstring("Authorization denied for user " + scraperUser))
	code, _ = do(http.MethodGet, "/debug/pprof/heap", bearer(scraperToken))
	g.Expect(code).To(Equal(http.StatusForbidden))
	code, body = do(http.MethodGet, "/metrics", bearer(strangerToken))
	g.Expect(code).To(Equal(http.StatusForbidden), "the scraper's grant is not the stranger's")
	g.Expect(body).To(ContainSubstring("Authorization denied for user " + strangerUser))
	g.Expect(served).To(Equal(1))

	for range 3 {
		code, _ = do(http.MethodGet, "/metrics", bearer(scraperToken))
		g.Expect(code).To(Equal(http.StatusOK))
	}
	g.Expect(counts()).To(Equal([]int{4, 4}), "scrapes within a minute need no new review")

	// A token is reviewed again after a minute, a refusal after 30 s, a grant after five.
	clk.SetTime(clk.Now().Add(61 * time.Second))
	api.allowed[scraperUser+" put /metrics"] = true
	code, _ = do(http.MethodPut, "/metrics", bearer(scraperToken))
	g.Expect(code).To(Equal(http.StatusOK), "a refusal is forgotten after 30 s")
	g.Expect(counts()).To(Equal([]int{5, 5}))
	clk.SetTime(clk.Now().Add(5 * time.Minute))
	api.allowed = nil // the grants were taken away
	code, _ = do(http.MethodGet, "/metrics", bearer(scraperToken))
	g.Expect(code).To(Equal(http.StatusForbidden))

	// A review that fails for a passing reason is tried again.
	api.users["retry-token-value"] = api.users[strangerToken]
	api.tokenErrs = []error{apierrors.NewServiceUnavailable("restarting"), apierrors.NewTooManyRequests("slow down", 1)}
	code, _ = do(http.MethodGet, "/metrics", bearer("retry-token-value"))
	g.Expect(code).To(Equal(http.StatusForbidden), "reviewed on the third try")
	g.Expect(counts()[0]).To(Equal(9))

	// One that fails for good, or keeps failing, is a 500, logged without the token.
	api.tokenErrs = []error{apierrors.NewForbidden(schema.GroupResource{Group: "authentication.k8s.io", Resource: "tokenreviews"}, "", errors.New("RBAC"))}
	code, body = do(http.MethodGet, "/metrics", bearer("another-token-value"))
	g.Expect(code).To(Equal(http.StatusInternalServerError))
	g.Expect(body).To(Equal("Authentication failed\n"))
	g.Expect(counts()[0]).To(Equal(10), "a refusal of the review is not tried again")
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	api.tokenErrs = []error{refused, refused, refused, refused, refused}
	code, _ = do(http.MethodGet, "/metrics", bearer("another-token-value"))
	g.Expect(code).To(Equal(http.StatusInternalServerError))
	g.Expect(counts()[0]).To(Equal(15), "five tries")
	api.sarErrs = []error{apierrors.NewForbidden(schema.GroupResource{Group: "authorization.k8s.io", Resource: "subjectaccessreviews"}, "", errors.New("RBAC"))}
	code, body = do(http.MethodGet, "/debug/pprof/symbol", bearer(strangerToken))
	g.Expect(code).To(Equal(http.StatusInternalServerError))
	g.Expect(body).To(ContainSubstring("Authorization for user " + strangerUser + " failed"))

	g.Expect(logs.String()).To(And(ContainSubstring("Authorization denied"), ContainSubstring("connection refused"), ContainSubstring("RBAC")))
	for _, token := range []string{scraperToken, strangerToken, "unknown-token-value", "retry-token-value", "another-token-value", "dXNlcjpwYXNz"} {
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
		if ok != (want != "") || ok && got != want {
			t.Errorf("bearerToken(%q) = %q, %v; want %q", header, got, ok, want)
		}
	}
}
