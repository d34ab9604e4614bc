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
	"k8s.io/client-go/rest"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

// profiler is the ServiceAccount that reads the provider's pprof endpoints, as an
// operator would: the secure diagnostics endpoint authenticates its token with a
// TokenReview and authorizes /debug/pprof/ with a SubjectAccessReview.
const profiler = "bench-profiler"

// heapProfile writes the provider's heap profile (after a GC) to file.
func heapProfile(ctx context.Context, cp *localcluster.ControlPlane, p *running, file string) error {
	token, err := localcluster.ServiceAccountToken(ctx, cp.Config, secretNamespace, profiler, "/debug/pprof/", "/debug/pprof/*")
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
