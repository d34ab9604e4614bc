package ipamapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// answer is a transport that answers every request with one fixed response.
type answer struct {
	status      int
	contentType string
	body        string
}

func (a answer) RoundTrip(r *http.Request) (*http.Response, error) {
	h := http.Header{}
	if a.contentType != "" {
		h.Set("Content-Type", a.contentType)
	}
	return &http.Response{StatusCode: a.status, Header: h, Body: io.NopCloser(strings.NewReader(a.body)), Request: r}, nil
}

// Whatever the IPAM-API (or a proxy in front of it) answers, the client returns a
// classified error or, for a 2xx JSON answer with a message, a response; the secret
// of the request never shows in an error, even when the answer echoes it ("SECRET" in
// the fuzzed body stands for it, raw or split by whitespace).
func FuzzAnswer(f *testing.F) {
	f.Add(201, "application/json", `{"message":"Address registered successfully","address":"83.118.168.0/32"}`)
	f.Add(400, "application/json", `{"message":"Invalid zone 'x'"}`)
	f.Add(404, "application/json; charset=utf-8", `{"message":"Address not found"}`)
	f.Add(500, "application/json", `{"message":"failed to query address documents","detail":"SECRET"}`)
	f.Add(200, "text/html", `<html><body>SECRET</body></html>`)
	f.Add(502, "", "bad gateway: top  secret\nvalue 01 SECRET")
	f.Add(200, "application/json", `{"message":null}`)
	f.Add(200, "application/json", `{"message":"ok","address":7}`)
	f.Add(399, "application/json", `{"message":"SECRET"}`)
	const sec = ipamapi.Secret("top secret value 01")
	f.Fuzz(func(t *testing.T, status int, contentType, body string) {
		if status < 100 || status > 999 {
			return
		}
		body = strings.ReplaceAll(body, "SECRET", sec.Value())
		c, err := ipamapi.NewClient("http://ipam.example", ipamapi.Options{Timeout: time.Second, Transport: answer{status, contentType, body}})
		if err != nil {
			t.Fatal(err)
		}
		req := ipamapi.Request{Secret: sec, Zone: "inet", Family: ipamapi.FamilyIPv4,
			Identity: ipamapi.Identity{ServiceName: "web", NamespaceID: "ns", ClusterID: "c"}}
		for _, call := range []func(context.Context, ipamapi.Request) (*ipamapi.Response, error){c.Register, c.Release} {
			res, err := call(context.Background(), req)
			if err == nil {
				if status < 200 || status >= 300 || res == nil {
					t.Fatalf("HTTP %d %q %q accepted as %+v", status, contentType, body, res)
				}
				continue
			}
			if ipamapi.ClassOf(err) == "" {
				t.Fatalf("HTTP %d: unclassified error %v", status, err)
			}
			for _, s := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err)} {
				if strings.Contains(s, sec.Value()) || strings.Contains(strings.Join(strings.Fields(s), " "), sec.Value()) {
					t.Fatalf("the secret is in the error: %s", s)
				}
			}
		}
	})
}
