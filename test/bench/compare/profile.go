package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/pkg/errors"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

// profiler is the ServiceAccount that reads the provider's pprof endpoints, as an
// operator would: the secure diagnostics endpoint authenticates its token with a
// TokenReview and authorizes /debug/pprof/ with a SubjectAccessReview.
const profiler = "bench-profiler"

// profilerToken creates the profiler, lets it read /debug/pprof/, and returns a token.
func profilerToken(ctx context.Context, cp *localcluster.ControlPlane) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: secretNamespace, Name: profiler}}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: profiler},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/debug/pprof/", "/debug/pprof/*"}, Verbs: []string{"get"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: profiler},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: profiler},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: secretNamespace, Name: profiler}}}
	for _, o := range []client.Object{sa, role, binding} {
		if err := cp.Client.Create(ctx, o); err != nil {
			return "", errors.Wrapf(err, "creating the profiler's %T", o)
		}
	}
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return "", err
	}
	tr, err := cs.CoreV1().ServiceAccounts(secretNamespace).CreateToken(ctx, profiler,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		return "", errors.Wrap(err, "a token for the profiler")
	}
	return tr.Status.Token, nil
}

// heapProfile writes the provider's heap profile (after a GC) to file.
func heapProfile(ctx context.Context, cp *localcluster.ControlPlane, p *running, file string) error {
	token, err := profilerToken(ctx, cp)
	if err != nil {
		return err
	}
	// The diagnostics endpoint's certificate is self-signed, made at the manager's start.
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a local process's self-signed certificate
	return download(ctx, c, "https://"+p.diagnostics+"/debug/pprof/heap?gc=1", token, file)
}

// apiServerProfile takes a CPU profile of kube-apiserver for d, starting after wait,
// in the background, and writes it to file; the returned function waits for it.
func apiServerProfile(ctx context.Context, cp *localcluster.ControlPlane, wait, d time.Duration, file string) func() error {
	done := make(chan error, 1)
	go func() {
		select {
		case <-ctx.Done():
			done <- ctx.Err()
			return
		case <-time.After(wait):
		}
		hc, err := rest.HTTPClientFor(cp.Config)
		if err != nil {
			done <- err
			return
		}
		done <- download(ctx, hc, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimSuffix(cp.Config.Host, "/"), int(d.Seconds())), "", file)
	}()
	return func() error { return <-done }
}

// download GETs url (with a bearer token, unless empty) and writes the body to file.
func download(ctx context.Context, c *http.Client, url, token, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody) //nolint:gosec // a local process's address
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req) //nolint:gosec // a local process's address
	if err != nil {
		return errors.Wrapf(err, "GET %s", url)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return errors.Errorf("GET %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return errors.Wrapf(err, "GET %s", url)
	}
	return os.WriteFile(file, b, 0o644) //nolint:gosec // a profile for people to read
}
