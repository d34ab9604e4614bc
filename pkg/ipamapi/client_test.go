package ipamapi_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

const secret = ipamapi.Secret("top-secret-value-0001")

func standIn(t *testing.T) (*sim.Server, *ipamapi.HTTPClient) {
	t.Helper()
	s := sim.New(sim.Config{})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c, err := ipamapi.NewClient(srv.URL, ipamapi.Options{Timeout: time.Second})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return s, c
}

func req(name, zone string, family ipamapi.Family, address string) ipamapi.Request {
	return ipamapi.Request{Secret: secret, Zone: zone, Family: family, Address: address,
		Identity: ipamapi.Identity{ServiceName: name, NamespaceID: "ns-uid", ClusterID: "cluster-uid"}}
}

// expectClass asserts the error's class and that the secret is not in its text.
func expectClass(g Gomega, err error, class ipamapi.Class, text string) {
	g.ExpectWithOffset(1, err).To(HaveOccurred())
	g.ExpectWithOffset(1, ipamapi.ClassOf(err)).To(Equal(class), err.Error())
	g.ExpectWithOffset(1, err.Error()).To(ContainSubstring(text))
	g.ExpectWithOffset(1, err.Error()).NotTo(ContainSubstring(secret.Value()))
	g.ExpectWithOffset(1, fmt.Sprintf("%+v %#v", err, err)).NotTo(ContainSubstring(secret.Value()))
}

func TestRegisterAndRelease(t *testing.T) {
	g := NewWithT(t)
	s, c := standIn(t)

	res, err := c.Register(context.Background(), req("a", "inet", ipamapi.FamilyIPv4, ""))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(Equal(&ipamapi.Response{Message: "Address registered successfully", Address: "83.118.168.0/32"}))
	g.Expect(res.Updated()).To(BeFalse())

	again, err := c.Register(context.Background(), req("a", "inet", ipamapi.FamilyIPv4, ""))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again.Address).To(Equal(res.Address))
	g.Expect(again.Updated()).To(BeTrue())

	// A bare address is sent in the stored CIDR form, so the release finds it.
	rel, err := c.Release(context.Background(), req("a", "inet", ipamapi.FamilyIPv4, "83.118.168.0"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rel.Message).To(Equal("Service expiration set successfully"))
	g.Expect(s.Holders("83.118.168.0/32")[0].ExpiresAt).NotTo(BeNil())

	// IPv6 with an explicit bare address.
	v6, err := c.Register(context.Background(), req("b", "inet", ipamapi.FamilyIPv6, "2a05:1234::42"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(v6.Address).To(Equal("2a05:1234::42/128"))
}

func TestErrorClasses(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	s, c := standIn(t)

	_, err := c.Register(ctx, req("v", "nowhere", ipamapi.FamilyIPv4, ""))
	expectClass(g, err, ipamapi.ClassValidation, "HTTP 400: invalid zone 'nowhere', must be one of: 'inet', 'hnet-private', 'hnet-public'")

	short := req("v", "inet", ipamapi.FamilyIPv4, "")
	short.Secret = "short"
	_, err = c.Register(ctx, short)
	expectClass(g, err, ipamapi.ClassValidation, "failed on the 'min' tag")

	_, err = c.Release(ctx, req("nobody", "inet", ipamapi.FamilyIPv4, "83.118.170.1"))
	expectClass(g, err, ipamapi.ClassNotHeld, "HTTP 404: Could not deregister service: no matching address found with the provivded secret")
	g.Expect(ipamapi.IsNotHeld(err)).To(BeTrue())

	_, err = c.Register(ctx, req("owner", "inet", ipamapi.FamilyIPv4, "83.118.170.2"))
	g.Expect(err).NotTo(HaveOccurred())
	_, err = c.Release(ctx, req("not-a-holder", "inet", ipamapi.FamilyIPv4, "83.118.170.2"))
	expectClass(g, err, ipamapi.ClassNotHeld, "service does not exist for this address")

	other := req("thief", "inet", ipamapi.FamilyIPv4, "83.118.170.2")
	other.Secret = "another-secret-value"
	_, err = c.Register(ctx, other)
	expectClass(g, err, ipamapi.ClassWrongSecret, "HTTP 500: Could not register address: no matching address found with the provided secret, zone and address")

	_, err = c.Register(ctx, req("far", "inet", ipamapi.FamilyIPv4, "8.8.8.8"))
	expectClass(g, err, ipamapi.ClassNotInZone, "the requested address is not valid for the provided zone")

	s.SetExhausted("hnet-public", "ipv4", true)
	_, err = c.Register(ctx, req("full", "hnet-public", ipamapi.FamilyIPv4, ""))
	expectClass(g, err, ipamapi.ClassExhausted, "no available prefix found for zone hnet-public_v4")
	g.Expect(ipamapi.IsExhausted(err)).To(BeTrue())

	_, err = c.Register(ctx, req("sharer", "inet", ipamapi.FamilyIPv4, "83.118.170.2"))
	g.Expect(err).NotTo(HaveOccurred())
	rotate := req("owner", "inet", ipamapi.FamilyIPv4, "83.118.170.2")
	rotate.NewSecret = "a-brand-new-secret"
	_, err = c.Register(ctx, rotate)
	expectClass(g, err, ipamapi.ClassRotationRefused, "multiple services registered. unable to change secret")
	g.Expect(err.Error()).NotTo(ContainSubstring("a-brand-new-secret"))

	// Only the IPAM-API's own 404s mean "not held"; a proxy's 404 does not.
	g.Expect(s.FailNext(1, http.StatusNotFound, `{"message":"no Route matched with those values"}`)).To(Succeed())
	_, err = c.Release(ctx, req("owner", "inet", ipamapi.FamilyIPv4, "83.118.170.2"))
	expectClass(g, err, ipamapi.ClassUnexpectedResponse, "HTTP 404: no Route matched")
	g.Expect(s.FailNext(1, http.StatusNotFound, "<html>404 Not Found</html>")).To(Succeed())
	_, err = c.Release(ctx, req("owner", "inet", ipamapi.FamilyIPv4, "83.118.170.2"))
	expectClass(g, err, ipamapi.ClassUnexpectedResponse, "HTTP 404")

	g.Expect(s.FailNext(1, http.StatusBadGateway, "<html>bad gateway</html>")).To(Succeed())
	_, err = c.Register(ctx, req("x", "inet", ipamapi.FamilyIPv4, ""))
	expectClass(g, err, ipamapi.ClassTransient, "HTTP 502")
	g.Expect(ipamapi.IsTransient(err)).To(BeTrue())

	g.Expect(s.FailNext(1, http.StatusInternalServerError, `{"message":"Could not register address: {\"prefix\":[\"Duplicate prefix found\"]}"}`)).To(Succeed())
	_, err = c.Register(ctx, req("x", "inet", ipamapi.FamilyIPv4, ""))
	expectClass(g, err, ipamapi.ClassBackendFailing, "Duplicate prefix found")

	g.Expect(s.FailNext(1, http.StatusInternalServerError, `{"message":"Could not register address: failed to save address: mongo down"}`)).To(Succeed())
	_, err = c.Register(ctx, req("x", "inet", ipamapi.FamilyIPv4, ""))
	expectClass(g, err, ipamapi.ClassBackendFailing, "failed to save address")
	g.Expect(ipamapi.IsTransient(err)).To(BeTrue())

	s.SetDown(true)
	_, err = c.Register(ctx, req("x", "inet", ipamapi.FamilyIPv4, ""))
	expectClass(g, err, ipamapi.ClassTransient, "IPAM-API register failed")
	s.SetDown(false)

	g.Expect(s.SetLatency(1500*time.Millisecond, 0)).To(Succeed())
	_, err = c.Register(ctx, req("slow", "inet", ipamapi.FamilyIPv4, ""))
	expectClass(g, err, ipamapi.ClassTransient, "no answer within 1s (the request may still complete on the server)")
	var apiErr *ipamapi.Error
	g.Expect(errorsAs(err, &apiErr)).To(BeTrue())
	g.Expect(apiErr.Unknown).To(BeTrue())
	s.ClearFaults()

	// Nothing listens: the request never left, so the next one may go at once.
	closed, err := ipamapi.NewClient("http://127.0.0.1:1", ipamapi.Options{Timeout: time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = closed.Register(ctx, req("nobody", "inet", ipamapi.FamilyIPv4, ""))
	expectClass(g, err, ipamapi.ClassTransient, "IPAM-API register failed")
	g.Expect(errorsAs(err, &apiErr)).To(BeTrue())
	g.Expect(apiErr.Unknown).To(BeFalse(), "a refused connection sent nothing: its outcome is known")
}

func errorsAs(err error, target **ipamapi.Error) bool {
	e, ok := err.(*ipamapi.Error) //nolint:errorlint // the client returns *Error unwrapped
	*target = e
	return ok
}

// The catch-all page answers every wrong URL with 200 text/html: that is an error.
func TestWrongEndpointIsAnError(t *testing.T) {
	g := NewWithT(t)
	s := sim.New(sim.Config{})
	srv := httptest.NewServer(s)
	defer srv.Close()
	c, err := ipamapi.NewClient(srv.URL+"/api", ipamapi.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = c.Register(context.Background(), req("a", "inet", ipamapi.FamilyIPv4, ""))
	expectClass(g, err, ipamapi.ClassUnexpectedResponse, "the answer is not the IPAM-API's JSON (text/html")
	g.Expect(err.Error()).To(ContainSubstring("check the endpoint URL"))

	// A trailing /v2 on the endpoint is accepted.
	c, err = ipamapi.NewClient(srv.URL+"/v2/", ipamapi.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = c.Register(context.Background(), req("a", "inet", ipamapi.FamilyIPv4, ""))
	g.Expect(err).NotTo(HaveOccurred())

	_, err = ipamapi.NewClient("ipam-api.vitistack.io", ipamapi.Options{})
	g.Expect(err).To(MatchError(ContainSubstring("is not an http:// or https:// URL")))
}

// Connections are reused: many sequential requests open few connections.
func TestKeepAlive(t *testing.T) {
	g := NewWithT(t)
	s := sim.New(sim.Config{})
	srv := httptest.NewUnstartedServer(s)
	var mu sync.Mutex
	conns := 0
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		mu.Lock()
		conns++
		mu.Unlock()
		return ctx
	}
	srv.Start()
	defer srv.Close()
	c, err := ipamapi.NewClient(srv.URL, ipamapi.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	for i := range 50 {
		_, err := c.Register(context.Background(), req(fmt.Sprintf("svc-%d", i), "inet", ipamapi.FamilyIPv4, ""))
		g.Expect(err).NotTo(HaveOccurred())
	}
	mu.Lock()
	defer mu.Unlock()
	g.Expect(conns).To(Equal(1))
}

func TestTLSWithCustomCA(t *testing.T) {
	g := NewWithT(t)
	srv := httptest.NewTLSServer(sim.New(sim.Config{}))
	defer srv.Close()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})

	// Without the CA the server is not trusted.
	c, err := ipamapi.NewClient(srv.URL, ipamapi.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = c.Register(context.Background(), req("a", "inet", ipamapi.FamilyIPv4, ""))
	expectClass(g, err, ipamapi.ClassTransient, "certificate")

	c, err = ipamapi.NewClient(srv.URL, ipamapi.Options{CABundle: caPEM})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = c.Register(context.Background(), req("a", "inet", ipamapi.FamilyIPv4, ""))
	g.Expect(err).NotTo(HaveOccurred())

	_, err = ipamapi.NewClient(srv.URL, ipamapi.Options{CABundle: []byte("not pem")})
	g.Expect(err).To(MatchError(ContainSubstring("no PEM certificate")))
}

func TestCanonicalCIDR(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1": "10.0.0.1/32", "10.0.0.1/32": "10.0.0.1/32", " 2a05:1234::1 ": "2a05:1234::1/128",
		"2A05:1234:0::1/128": "2a05:1234::1/128",
	} {
		got, err := ipamapi.CanonicalCIDR(in)
		NewWithT(t).Expect(err).NotTo(HaveOccurred())
		NewWithT(t).Expect(got).To(Equal(want), in)
	}
	for _, bad := range []string{"10.0.0.0/24", "nope", "10.0.0.1/33", "fe80::1%eth0"} {
		_, err := ipamapi.CanonicalCIDR(bad)
		NewWithT(t).Expect(err).To(HaveOccurred(), bad)
	}
}

func TestSecretNeverPrints(t *testing.T) {
	g := NewWithT(t)
	r := req("a", "inet", ipamapi.FamilyIPv4, "")
	r.NewSecret = "new-secret-value-99"
	for _, s := range []string{fmt.Sprintf("%v", r), fmt.Sprintf("%+v", r), fmt.Sprintf("%#v", r), fmt.Sprint(r.Secret)} {
		g.Expect(s).NotTo(ContainSubstring(secret.Value()))
		g.Expect(s).NotTo(ContainSubstring("new-secret-value-99"))
	}
	g.Expect(r.Secret.String()).To(Equal("[redacted]"))
}

// Redact cuts a value out of a text in every form an echoed request or object shows it:
// as it is; in JSON as Go writes it, without HTML escaping, ASCII only (as Python
// writes it), and inside a JSON string (as kubectl's last-applied-configuration is
// quoted); base64 in both alphabets, padded or not; hexadecimal; a byte slice as Go
// prints it (a corev1.Secret's %v). A longer value goes first, so that a short one
// inside it (in a digest, say) leaves nothing of it behind; an empty value cuts nothing.
func TestRedact(t *testing.T) {
	value := `pa"ss\<wörd>😀` // 17 bytes: base64 ends in one "="
	b := []byte(value)
	marshal := func(v any, escapeHTML bool) string {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(escapeHTML)
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(buf.String())
	}
	for _, tc := range []struct{ what, echo, want string }{
		{"as it is", value, "[redacted]"},
		{"in Go's JSON", marshal(map[string]string{"v": value}, true), `{"v":"[redacted]"}`},
		{"in JSON without HTML escaping", marshal(map[string]string{"v": value}, false), `{"v":"[redacted]"}`},
		{"in ASCII-only JSON", `{"v": "pa\"ss\\<w\u00f6rd>\ud83d\ude00"}`, `{"v": "[redacted]"}`},
		{"in JSON inside a JSON string", marshal(map[string]string{"a": marshal(map[string]string{"v": value}, true)}, true), `{"a":"{\"v\":\"[redacted]\"}"}`},
		{"in base64", base64.StdEncoding.EncodeToString(b), "[redacted]="},
		{"in URL-safe base64", base64.URLEncoding.EncodeToString(b), "[redacted]="},
		{"in unpadded base64", base64.RawStdEncoding.EncodeToString(b), "[redacted]"},
		{"in hexadecimal", hex.EncodeToString(b), "[redacted]"},
		{"as Go prints bytes", fmt.Sprint(b), "[redacted]"}, //nolint:staticcheck // the list of decimal bytes is the echo wanted
		{"in upper-case hexadecimal", strings.ToUpper(hex.EncodeToString(b)), "[redacted]"},
		{"percent-encoded", url.QueryEscape(value), "[redacted]"},
		{"quoted by Go", strconv.QuoteToASCII(value), `"[redacted]"`},
		// "ab"+value+"cd" is 21 bytes: value's 17 start at offset 2, so its bytes 1–15 make
		// whole groups (characters 4–23); the characters around them mix in "ab" and "cd".
		{"inside a longer base64 blob", base64.StdEncoding.EncodeToString([]byte("ab" + value + "cd")),
			base64.StdEncoding.EncodeToString([]byte("ab" + value + "cd"))[:4] + "[redacted]" + base64.StdEncoding.EncodeToString([]byte("ab" + value + "cd"))[24:]},
	} {
		if got := ipamapi.Redact("refused: "+tc.echo+" (end)", "", value); got != "refused: "+tc.want+" (end)" {
			t.Errorf("the value %s: got %s", tc.what, got)
		}
	}
	digest := "sha256:0a1b2c3d"
	if got := ipamapi.Redact("digest "+digest, "1b2c", digest); got != "digest [redacted]" {
		t.Errorf("a short value inside a digest: got %s", got)
	}
}

// fixedAnswer serves one status, content type and body to every request.
func fixedAnswer(t *testing.T, status int, ctype, body string) *ipamapi.HTTPClient {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", ctype)
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	c, err := ipamapi.NewClient(srv.URL, ipamapi.Options{Timeout: time.Second})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return c
}

// Every answer the IPAM-API (or something in front of it) gives on failure, and its class.
func TestClassification(t *testing.T) {
	const (
		js   = "application/json; charset=utf-8"
		html = "text/html; charset=utf-8"
		sel  = `server selection error: server selection timeout, current topology: { Type: Unknown, Servers: [{ Addr: ipam-system-mongodb:27017, Type: Unknown, Last error: dial tcp 10.96.112.34:27017: connect: connection refused }, ] }`
	)
	msg := func(m string) string {
		b, err := json.Marshal(map[string]string{"message": m})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, tc := range []struct {
		name   string
		status int
		ctype  string
		body   string
		class  ipamapi.Class
	}{
		// 400
		{"NetBox down behind ingress-nginx", 400, js, msg("failed to fetch zones: <html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>"), ipamapi.ClassBackendFailing},
		{"NetBox refuses connections", 400, js, msg(`failed to fetch zones: Get "https://netbox.example/api/extras/custom-field-choice-sets/?q=k8s_zone_choices": dial tcp 10.0.0.7:443: connect: connection refused`), ipamapi.ClassBackendFailing},
		{"NetBox answers an empty body", 400, js, msg("failed to fetch zones: "), ipamapi.ClassBackendFailing},
		{"no prefixes for inet ipv4 (loading)", 400, js, msg("no prefixes found for zone inet with IP family ipv4"), ipamapi.ClassNoPrefixes},
		{"no prefixes for hnet-private ipv6", 400, js, msg("no prefixes found for zone hnet-private with IP family ipv6"), ipamapi.ClassNoPrefixes},
		{"parse error", 400, js, msg("Could not parse incomming request"), ipamapi.ClassValidation},
		{"validator", 400, js, msg("Key: 'IpamAPIRequest.Secret' Error:Field validation for 'Secret' failed on the 'min' tag"), ipamapi.ClassValidation},
		{"retention", 400, js, msg("retention period cannot be more than 30 days"), ipamapi.ClassValidation},
		{"invalid zone", 400, js, msg("invalid zone 'nowhere', must be one of: 'inet', 'hnet-private', 'hnet-public'"), ipamapi.ClassValidation},
		{"invalid zone named like a backend failure", 400, js, msg("invalid zone 'failed to fetch zones', must be one of: 'inet'"), ipamapi.ClassValidation},
		{"invalid ip prefix", 400, js, msg("invalid ip prefix: nope"), ipamapi.ClassValidation},
		{"wrong family", 400, js, msg("invalid ip familiy for the provided address"), ipamapi.ClassValidation},
		{"a proxy's 400 page", 400, html, "<html><body><h1>400 Bad Request</h1>Request Header Or Cookie Too Large</body></html>", ipamapi.ClassUnexpectedResponse},
		// 404
		{"not held: no matching address", 404, js, msg("Could not deregister service: no matching address found with the provivded secret, zone and address"), ipamapi.ClassNotHeld},
		{"not held: service does not exist", 404, js, msg("Could not deregister service: service does not exist for this address"), ipamapi.ClassNotHeld},
		{"MongoDB down on release", 404, js, msg("Could not deregister service: failed to read address document: " + sel), ipamapi.ClassBackendFailing},
		{"MongoDB fails writing the release", 404, js, msg("Could not deregister service: failed to update services array: connection pool cleared"), ipamapi.ClassBackendFailing},
		{"a proxy's JSON 404", 404, js, msg("no Route matched with those values"), ipamapi.ClassUnexpectedResponse},
		{"a gateway's JSON 404 Not Found", 404, js, msg("Not Found"), ipamapi.ClassUnexpectedResponse},
		{"a proxy's HTML 404", 404, html, "<html>404 Not Found</html>", ipamapi.ClassUnexpectedResponse},
		// 500
		{"MongoDB down on register", 500, js, msg("failed to query address documents: " + sel), ipamapi.ClassBackendFailing},
		{"MongoDB down on update", 500, js, msg("Could not register address: failed to read address document: " + sel), ipamapi.ClassBackendFailing},
		{"MongoDB fails decoding", 500, js, msg("failed to decode address document: EOF"), ipamapi.ClassBackendFailing},
		{"MongoDB fails saving", 500, js, msg("Could not register address: failed to save address: " + sel), ipamapi.ClassBackendFailing},
		{"MongoDB fails updating", 500, js, msg("Could not register address: failed to update address: write concern error"), ipamapi.ClassBackendFailing},
		{"wrong secret", 500, js, msg("Could not register address: no matching address found with the provided secret, zone and address"), ipamapi.ClassWrongSecret},
		{"not in zone", 500, js, msg("Could not register address: the requested address is not valid for the provided zone"), ipamapi.ClassNotInZone},
		{"exhausted", 500, js, msg("Could not register address: no available prefix found for zone inet_v4"), ipamapi.ClassExhausted},
		{"rotation: several holders", 500, js, msg("Could not register address: multiple services registered. unable to change secret"), ipamapi.ClassRotationRefused},
		{"rotation: mismatch", 500, js, msg("Could not register address: service mismatch. unable to change secret"), ipamapi.ClassRotationRefused},
		{"NetBox refuses a prefix", 500, js, msg(`Could not register address: {"prefix":["Duplicate prefix found in global table: 10.0.0.1/32"]}`), ipamapi.ClassBackendFailing},
		{"a proxy's 500 page", 500, html, "<html>500 Internal Server Error</html>", ipamapi.ClassTransient},
		// others
		{"bad gateway", 502, html, "<html>502 Bad Gateway</html>", ipamapi.ClassTransient},
		{"unavailable", 503, js, msg("maintenance"), ipamapi.ClassTransient},
		{"catch-all page", 200, html, "<html>Vitistack IPAM-API</html>", ipamapi.ClassUnexpectedResponse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			c := fixedAnswer(t, tc.status, tc.ctype, tc.body)
			_, err := c.Release(context.Background(), req("a", "inet", ipamapi.FamilyIPv4, "10.0.0.1"))
			expectClass(g, err, tc.class, fmt.Sprintf("HTTP %d", tc.status))
			g.Expect(ipamapi.IsTransient(err)).To(Equal(tc.class == ipamapi.ClassTransient || tc.class == ipamapi.ClassBackendFailing))
			g.Expect(ipamapi.IsNotHeld(err)).To(Equal(tc.class == ipamapi.ClassNotHeld))
			// What may pass for a zone that worked: the zone unknown, or its prefixes not loaded.
			_, _, gone := ipamapi.ZoneGone(err, "inet", ipamapi.FamilyIPv4)
			g.Expect(gone).To(Equal(tc.class == ipamapi.ClassNoPrefixes || strings.HasPrefix(tc.name, "invalid zone")), "ZoneGone")
		})
	}
}

// The client against the stand-in with each backend failure on: the class, and that
// nothing happened on the server.
func TestBackendFailuresOfTheStandIn(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	s, c := standIn(t)
	held, err := c.Register(ctx, req("a", "inet", ipamapi.FamilyIPv4, ""))
	g.Expect(err).NotTo(HaveOccurred())
	before := s.Registrations()

	check := func(class ipamapi.Class, regText, relText string) {
		t.Helper()
		_, err := c.Register(ctx, req("b", "inet", ipamapi.FamilyIPv4, ""))
		expectClass(g, err, class, regText)
		_, err = c.Register(ctx, req("a", "inet", ipamapi.FamilyIPv4, ""))
		expectClass(g, err, class, regText)
		_, err = c.Release(ctx, req("a", "inet", ipamapi.FamilyIPv4, held.Address))
		expectClass(g, err, class, relText)
		g.Expect(ipamapi.IsNotHeld(err)).To(BeFalse())
		g.Expect(s.Registrations()).To(Equal(before))
	}

	s.SetNetBoxDown(true, "")
	check(ipamapi.ClassBackendFailing, "HTTP 400: failed to fetch zones: <html>", "HTTP 400: failed to fetch zones: <html>")
	s.SetNetBoxDown(true, "upstream connect error or disconnect/reset before headers")
	_, err = c.Release(ctx, req("a", "inet", ipamapi.FamilyIPv4, held.Address))
	expectClass(g, err, ipamapi.ClassBackendFailing, "failed to fetch zones: upstream connect error")
	g.Expect(ipamapi.IsTransient(err)).To(BeTrue())
	s.ClearFaults()

	s.SetPrefixesLoading(true)
	check(ipamapi.ClassNoPrefixes, "HTTP 400: no prefixes found for zone inet with IP family ipv4", "HTTP 400: no prefixes found for zone inet with IP family ipv4")
	_, err = c.Register(ctx, req("a", "inet", ipamapi.FamilyIPv4, ""))
	g.Expect(ipamapi.IsTransient(err)).To(BeFalse(), "the caller decides whether no prefixes is transient")
	s.ClearFaults()

	g.Expect(s.SetMongoDown(true, 50*time.Millisecond)).To(Succeed())
	check(ipamapi.ClassBackendFailing, "HTTP 500: failed to query address documents: server selection error: ",
		"HTTP 404: Could not deregister service: failed to read address document: server selection error: ")
	_, err = c.Release(ctx, req("a", "inet", ipamapi.FamilyIPv4, held.Address))
	g.Expect(ipamapi.IsTransient(err)).To(BeTrue())
	s.ClearFaults()

	// Back to normal: the same identity gets its address back and can release it.
	again, err := c.Register(ctx, req("a", "inet", ipamapi.FamilyIPv4, ""))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again.Address).To(Equal(held.Address))
	_, err = c.Release(ctx, req("a", "inet", ipamapi.FamilyIPv4, held.Address))
	g.Expect(err).NotTo(HaveOccurred())
}

// Every request sent is observed once, with what it was for and its outcome.
func TestObservedRequests(t *testing.T) {
	g := NewWithT(t)
	s := sim.New(sim.Config{})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	var seen []string
	var mu sync.Mutex
	c, err := ipamapi.NewClient(srv.URL, ipamapi.Options{Timeout: time.Second, Observe: func(op ipamapi.Operation, err error, _ time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, string(op)+" "+ipamapi.Outcome(err))
	}})
	g.Expect(err).NotTo(HaveOccurred())
	ctx := context.Background()

	res, err := c.Register(ctx, req("a", "inet", ipamapi.FamilyIPv4, ""))
	g.Expect(err).NotTo(HaveOccurred())
	rotate := req("a", "inet", ipamapi.FamilyIPv4, res.Address)
	rotate.NewSecret = "another-secret-value-2"
	_, err = c.Register(ctx, rotate)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = c.Release(ctx, req("a", "inet", ipamapi.FamilyIPv4, res.Address)) // the old secret: not held
	g.Expect(ipamapi.ClassOf(err)).To(Equal(ipamapi.ClassNotHeld))
	_, err = c.Release(ipamapi.WithOperation(ctx, ipamapi.OpProbe), req("probe", "nowhere", ipamapi.FamilyIPv4, "192.0.2.1/32"))
	g.Expect(err).To(HaveOccurred())
	g.Expect(s.DropNext(sim.DropAfter, 1)).To(Succeed())
	_, err = c.Register(ctx, req("lost", "inet", ipamapi.FamilyIPv4, ""))
	g.Expect(ipamapi.IsTransient(err)).To(BeTrue())

	g.Expect(seen).To(Equal([]string{"register success", "rotate success", "release not_held", "probe validation", "register transient"}))
}

// Every request names the provider and its version in its User-Agent (the IPAM-API's
// log shows it), not Go's default Go-http-client/1.1.
func TestUserAgent(t *testing.T) {
	g := NewWithT(t)
	s := sim.New(sim.Config{})
	var mu sync.Mutex
	var agents []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		agents = append(agents, r.Method+" "+r.URL.Path+" "+r.Header.Get("User-Agent"))
		mu.Unlock()
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c, err := ipamapi.NewClient(srv.URL, ipamapi.Options{Timeout: time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	ctx := context.Background()

	g.Expect(ipamapi.Version).To(Equal("dev"), "a build without -X main.version")
	res, err := c.Register(ctx, req("a", "inet", ipamapi.FamilyIPv4, ""))
	g.Expect(err).NotTo(HaveOccurred())

	// As the manager sets it at its start, from the version it was built with.
	defer func(v string) { ipamapi.Version = v }(ipamapi.Version)
	ipamapi.Version = "v1.2.3"
	_, err = c.Register(ctx, req("a", "inet", ipamapi.FamilyIPv4, res.Address))
	g.Expect(err).NotTo(HaveOccurred())
	_, err = c.Release(ctx, req("a", "inet", ipamapi.FamilyIPv4, res.Address))
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(agents).To(Equal([]string{
		"POST /v2/address cluster-api-ipam-provider-vitistack/dev",
		"POST /v2/address cluster-api-ipam-provider-vitistack/v1.2.3",
		"DELETE /v2/service cluster-api-ipam-provider-vitistack/v1.2.3",
	}))
}
