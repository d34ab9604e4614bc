package sim_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// startSim serves a stand-in on a real loopback listener (needed for connection drops).
func startSim(t *testing.T, cfg sim.Config) (*sim.Server, string) {
	t.Helper()
	s, err := sim.NewServer(cfg)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts.URL
}

type answer struct {
	status int
	ctype  string
	body   string
	err    error
}

func call(t *testing.T, method, url, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatalf("NewRequest: %v", err)
	}
	// A fresh connection per call, so a dropped connection is never retried.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), body: string(b), err: err}
}

// serve calls the handler in-process (no network), for high-volume tests.
func serve(h http.Handler, method, path, body string) answer {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	return answer{status: rec.Code, ctype: rec.Header().Get("Content-Type"), body: rec.Body.String()}
}

// body builds a request body; address "" is omitted.
func body(secret, zone, family, address, svc string, retention int) string {
	addr := ""
	if address != "" {
		addr = fmt.Sprintf(`"address":%q,`, address)
	}
	return fmt.Sprintf(`{"secret":%q,"zone":%q,"ip_family":%q,%s"service":{"service_name":%q,"namespace_id":"ns-1","cluster_id":"cluster-1","retention_period_days":%d}}`,
		secret, zone, family, addr, svc, retention)
}

func registered(addr string) string {
	return `{"message":"Address registered successfully","address":"` + addr + `"}`
}

func updated(addr string) string {
	return `{"message":"Address updated successfully","address":"` + addr + `"}`
}

func ref(svc string) sim.ServiceRef {
	return sim.ServiceRef{ServiceName: svc, NamespaceID: "ns-1", ClusterID: "cluster-1"}
}

const secretA = "secret-aaaaaaaa"
const secretB = "secret-bbbbbbbb"
