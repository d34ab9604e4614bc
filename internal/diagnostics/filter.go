package diagnostics

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// How long reviews are remembered (controller-runtime's filter remembers tokens for a
// minute, allowed requests for 5 minutes and denied ones for 30 s), how many, and how
// long one may take.
const (
	tokenTTL        = time.Minute
	unknownTokenTTL = 10 * time.Second
	allowTTL        = 5 * time.Minute
	denyTTL         = 30 * time.Second
	cacheSize       = 1024
	reviewTimeout   = 10 * time.Second
)

// reviewBackoff is how a review that failed for a passing reason (a timeout, a 429 or
// 5xx, a connection reset) is tried again: up to 5 tries, 0.5 s apart and growing
// (about 4 s when each fails at once), as the API server's delegating authenticator
// and authorizer do.
var reviewBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// WithAuthenticationAndAuthorization is a metricsserver.FilterProvider: a request goes
// through when its bearer token is valid (a TokenReview) and its user may use the
// verb on the path (a SubjectAccessReview for a non-resource URL). The manager needs
// create on tokenreviews and subjectaccessreviews; a scraper needs, for example,
// nonResourceURLs ["/metrics"] verbs ["get"].
func WithAuthenticationAndAuthorization(config *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	authn, err := authenticationclient.NewForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, err
	}
	authz, err := authorizationclient.NewForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, err
	}
	return newReviewer(authn.TokenReviews(), authz.SubjectAccessReviews(), clock.RealClock{}, reviewBackoff).filter, nil
}

func newReviewer(tokens authenticationclient.TokenReviewInterface, access authorizationclient.SubjectAccessReviewInterface,
	clk clock.PassiveClock, backoff wait.Backoff) *reviewer {
	return &reviewer{tokens: tokens, access: access, backoff: backoff,
		users: cache.NewLRUExpireCacheWithClock(cacheSize, clk), decisions: cache.NewLRUExpireCacheWithClock(cacheSize, clk)}
}

// reviewer asks the API server who a token belongs to and what its user may do, and
// remembers the answers for a while.
type reviewer struct {
	tokens    authenticationclient.TokenReviewInterface
	access    authorizationclient.SubjectAccessReviewInterface
	users     *cache.LRUExpireCache // sha256 of a token → reviewedToken
	decisions *cache.LRUExpireCache // a SubjectAccessReview's spec → allowed
	backoff   wait.Backoff
}

type reviewedToken struct {
	authenticated bool
	user          authenticationv1.UserInfo
}

func (r *reviewer) filter(log logr.Logger, next http.Handler) (http.Handler, error) {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		user, ok, err := r.authenticate(req)
		if err != nil {
			log.Error(err, "Authentication failed")
			http.Error(w, "Authentication failed", http.StatusInternalServerError)
			return
		}
		if !ok {
			log.V(4).Info("Authentication failed")
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		allowed, err := r.authorize(req.Context(), user, strings.ToLower(req.Method), req.URL.Path)
		if err != nil {
			msg := fmt.Sprintf("Authorization for user %s failed", user.Username)
			log.Error(err, msg)
			http.Error(w, msg, http.StatusInternalServerError)
			return
		}
		if !allowed {
			msg := fmt.Sprintf("Authorization denied for user %s", user.Username)
			log.V(4).Info(msg, "path", req.URL.Path)
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		// The handlers need no credentials.
		req = req.Clone(req.Context())
		req.Header.Del("Authorization")
		next.ServeHTTP(w, req)
	}), nil
}

// authenticate reviews the request's bearer token; a request without one is not
// authenticated. The token itself is neither kept nor logged: only its digest.
func (r *reviewer) authenticate(req *http.Request) (authenticationv1.UserInfo, bool, error) {
	token, ok := bearerToken(req.Header.Get("Authorization"))
	if !ok {
		return authenticationv1.UserInfo{}, false, nil
	}
	sum := sha256.Sum256([]byte(token))
	key := hex.EncodeToString(sum[:])
	if v, ok := r.users.Get(key); ok {
		t := v.(reviewedToken)
		return t.user, t.authenticated, nil
	}
	var review *authenticationv1.TokenReview
	err := r.retry(req.Context(), func(ctx context.Context) (err error) {
		review, err = r.tokens.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return authenticationv1.UserInfo{}, false, fmt.Errorf("reviewing the token: %w", err)
	}
	t := reviewedToken{authenticated: review.Status.Authenticated && review.Status.Error == "", user: review.Status.User}
	if t.authenticated && !slices.Contains(t.user.Groups, allAuthenticated) {
		// As the API server's token authenticator: every authenticated user is in it.
		t.user.Groups = append(t.user.Groups, allAuthenticated)
	}
	ttl := tokenTTL
	if !t.authenticated {
		ttl = unknownTokenTTL
	}
	r.users.Add(key, t, ttl)
	return t.user, t.authenticated, nil
}

// bearerToken is the token of an "Authorization: Bearer <token>" header.
func bearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	token = strings.TrimSpace(token)
	return token, ok && strings.EqualFold(scheme, "bearer") && token != "" && !strings.Contains(token, " ")
}

// authorize asks whether user may use verb on the non-resource URL path.
func (r *reviewer) authorize(ctx context.Context, user authenticationv1.UserInfo, verb, path string) (bool, error) {
	spec := authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb},
	}
	if len(user.Extra) > 0 {
		spec.Extra = make(map[string]authorizationv1.ExtraValue, len(user.Extra))
		for k, v := range user.Extra {
			spec.Extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	k, err := json.Marshal(spec) // maps marshal with sorted keys
	if err != nil {
		return false, err
	}
	key := string(k)
	if v, ok := r.decisions.Get(key); ok {
		return v.(bool), nil
	}
	var review *authorizationv1.SubjectAccessReview
	err = r.retry(ctx, func(ctx context.Context) (err error) {
		review, err = r.access.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return false, fmt.Errorf("reviewing the access: %w", err)
	}
	allowed := review.Status.Allowed && !review.Status.Denied
	ttl := allowTTL
	if !allowed {
		ttl = denyTTL
	}
	r.decisions.Add(key, allowed, ttl)
	return allowed, nil
}

// allAuthenticated is the group of every authenticated user.
const allAuthenticated = "system:authenticated"

// retry calls review, each try limited to reviewTimeout, until it succeeds, fails for
// good, or the backoff's tries are used up.
func (r *reviewer) retry(ctx context.Context, review func(context.Context) error) error {
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, r.backoff, func(ctx context.Context) (bool, error) {
		tctx, cancel := context.WithTimeout(ctx, reviewTimeout)
		defer cancel()
		last = review(tctx)
		if last != nil && passing(last) {
			return false, nil
		}
		return true, last
	})
	if wait.Interrupted(err) && last != nil {
		return last
	}
	return err
}

// passing reports whether a review failed for a reason that may be gone a moment later.
func passing(err error) bool {
	var netErr net.Error
	return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsUnexpectedServerError(err) ||
		utilnet.IsConnectionReset(err) || utilnet.IsHTTP2ConnectionLost(err) || utilnet.IsProbableEOF(err) ||
		errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr)
}
