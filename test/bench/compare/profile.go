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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+p.diagnostics+"/debug/pprof/heap?gc=1", http.NoBody) //nolint:gosec // the local manager's address
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	// The diagnostics endpoint's certificate is self-signed, made at the manager's start.
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a local process's self-signed certificate
	resp, err := c.Do(req)                                                                                //nolint:gosec // the local manager's address
	if err != nil {
		return errors.Wrap(err, "heap profile")
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return errors.Errorf("heap profile: %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return errors.Wrap(err, "heap profile")
	}
	return errors.Wrap(os.WriteFile(file, b, 0o644), "heap profile") //nolint:gosec // a profile for people to read
}

// apiServerProfile takes a CPU profile of kube-apiserver for d, starting after wait,
// in the background, and writes it to file; the returned function waits for it.
func apiServerProfile(ctx context.Context, cp *localcluster.ControlPlane, wait, d time.Duration, file string) func() error {
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
			hc, err := rest.HTTPClientFor(cp.Config)
			if err != nil {
				return err
			}
			url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimSuffix(cp.Config.Host, "/"), int(d.Seconds()))
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody) //nolint:gosec // the local control plane
			if err != nil {
				return err
			}
			resp, err := hc.Do(req) //nolint:gosec // the local control plane
			if err != nil {
				return errors.Wrap(err, "kube-apiserver profile")
			}
			defer func() { _ = resp.Body.Close() }()
			if resp.StatusCode != http.StatusOK {
				return errors.Errorf("kube-apiserver profile: %s", resp.Status)
			}
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			return os.WriteFile(file, b, 0o644) //nolint:gosec // a profile for people to read
		}()
	}()
	return func() error { return <-done }
}
