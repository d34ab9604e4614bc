package ipamapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/pkg/errors"
)

// Client talks to one IPAM-API endpoint. Controllers depend on this interface; the
// real implementation is HTTPClient, and tests run it against the sim stand-in.
type Client interface {
	// Register sends POST /v2/address: allocate, re-confirm, share or rotate.
	Register(ctx context.Context, req Request) (*Response, error)
	// Release sends DELETE /v2/service: end one holder's hold on an address.
	Release(ctx context.Context, req Request) (*Response, error)
}

// Options configure an HTTPClient.
type Options struct {
	// Timeout bounds every request, including reading the answer. Default 10s.
	Timeout time.Duration
	// CABundle is a PEM bundle to trust instead of the system roots.
	CABundle []byte
	// Transport replaces the HTTP transport (tests). CABundle is ignored then.
	Transport http.RoundTripper
	// Observe, if set, is called after every request sent with what it was for, its
	// error (nil: success) and its duration, for metrics. Requests refused before they
	// are sent are not observed.
	Observe func(op Operation, err error, d time.Duration)
}

// DefaultTimeout is the per-request deadline when Options.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// Product is the product of the User-Agent every request carries, Product/Version.
const Product = "cluster-api-ipam-provider-vitistack"

// Version is the provider's version in the User-Agent of every request, so that the
// IPAM-API's log tells the provider's requests, and its release, apart from others. The
// manager sets it at its start to the version it was built with (-X main.version).
var Version = "dev"

// UserAgent is the User-Agent header of every request: Product/Version.
func UserAgent() string {
	v := Version
	if v == "" {
		v = "dev"
	}
	return Product + "/" + v
}

// HTTPClient is the Client for the real IPAM-API.
type HTTPClient struct {
	base    *url.URL
	http    *http.Client
	timeout time.Duration
	observe func(Operation, error, time.Duration)
}

var _ Client = &HTTPClient{}

// NewClient returns a client for the IPAM-API at endpoint, for example
// "https://ipam-api.example.org". A trailing "/v2" is accepted and ignored.
func NewClient(endpoint string, opts Options) (*HTTPClient, error) {
	base, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	rt := opts.Transport
	if rt == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = 100
		t.MaxIdleConnsPerHost = 32
		t.ResponseHeaderTimeout = opts.Timeout
		t.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		if len(opts.CABundle) > 0 {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(opts.CABundle) {
				return nil, errors.New("the CA bundle holds no PEM certificate")
			}
			t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}
		rt = t
	}
	return &HTTPClient{
		base:    base,
		http:    &http.Client{Transport: rt, CheckRedirect: noRedirects},
		timeout: opts.Timeout,
		observe: opts.Observe,
	}, nil
}

// NormalizeEndpoint returns the canonical form of an endpoint (what ParseEndpoint
// keeps), so that one IPAM-API is always named the same way; an unparsable endpoint is
// returned as it is.
func NormalizeEndpoint(endpoint string) string {
	u, err := ParseEndpoint(endpoint)
	if err != nil {
		return endpoint
	}
	return u.String()
}

// ParseEndpoint checks an IPAM-API base URL and strips a trailing "/v2".
func ParseEndpoint(endpoint string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(endpoint))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.Errorf("IPAM-API endpoint %q is not an http:// or https:// URL, for example https://ipam-api.example.org", endpoint)
	}
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v2")
	u.RawQuery, u.Fragment = "", ""
	return u, nil
}

func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Register implements Client.
func (c *HTTPClient) Register(ctx context.Context, req Request) (*Response, error) {
	res, err := c.do(ctx, "register", http.MethodPost, "/v2/address", req)
	if err != nil {
		return nil, err
	}
	if res.Address == "" {
		return nil, &Error{Op: "register", StatusCode: http.StatusOK, Class: ClassUnexpectedResponse,
			Message: "the answer carries no address: is the endpoint the IPAM-API?"}
	}
	return res, nil
}

// Release implements Client.
func (c *HTTPClient) Release(ctx context.Context, req Request) (*Response, error) {
	return c.do(ctx, "release", http.MethodDelete, "/v2/service", req)
}

func (c *HTTPClient) do(ctx context.Context, op, method, path string, req Request) (res *Response, err error) {
	body, err := req.body()
	if err != nil {
		return nil, &Error{Op: op, Class: ClassValidation, Message: err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	u := *c.base
	u.Path += path
	hreq, err := http.NewRequestWithContext(ctx, method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, errors.Wrap(err, "building IPAM-API request")
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	hreq.Header.Set("User-Agent", UserAgent())

	start, status := time.Now(), 0
	defer func() {
		if err != nil {
			err = scrub(err, req)
		}
		if c.observe != nil {
			c.observe(operationOf(ctx, method, req), err, time.Since(start))
		}
	}()

	hres, err := c.http.Do(hreq)
	if err != nil {
		// A connection that was never made carried nothing: the outcome is known (nothing
		// happened). Any other transport error may have come after the server got it.
		return nil, &Error{Op: op, Class: ClassTransient, Unknown: !neverConnected(err), Message: transportMessage(err, c.timeout)}
	}
	defer func() { _ = hres.Body.Close() }()
	status = hres.StatusCode
	raw, err := io.ReadAll(io.LimitReader(hres.Body, 1<<20))
	if err != nil {
		return nil, &Error{Op: op, StatusCode: status, Class: ClassTransient, Unknown: true, Message: transportMessage(err, c.timeout)}
	}

	var wire wireResponse
	mt, _, _ := mime.ParseMediaType(hres.Header.Get("Content-Type"))
	if mt != "application/json" || json.Unmarshal(raw, &wire) != nil || wire.Message == nil {
		e := classify(op, status, "the answer is not the IPAM-API's JSON ("+describe(mt, scrubBody(raw, req))+"): check the endpoint URL")
		if status <= http.StatusBadRequest || status == http.StatusNotFound {
			// The IPAM-API answers every 400 and 404 in JSON: one without it is a proxy's
			// (never "not held", never the request's fault).
			e.Class = ClassUnexpectedResponse
		}
		return nil, e
	}
	if status < 200 || status >= 300 {
		return nil, classify(op, status, *wire.Message)
	}
	return &Response{Message: *wire.Message, Address: wire.Address}, nil
}

func describe(mediaType string, raw []byte) string {
	if mediaType == "" {
		mediaType = "no content type"
	}
	snippet := strings.Join(strings.Fields(string(raw)), " ")
	if len(snippet) > 80 {
		snippet = snippet[:80] + "..."
	}
	if snippet == "" {
		return mediaType + ", empty body"
	}
	return mediaType + ": " + snippet
}

func transportMessage(err error, timeout time.Duration) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		return "no answer within " + timeout.String() + " (the request may still complete on the server)"
	}
	if errors.Is(err, context.Canceled) {
		return "request cancelled"
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// scrubBody removes the secrets of req from a raw answer (see Redact), before any of
// it is shortened into a message.
func scrubBody(raw []byte, req Request) []byte {
	return []byte(Redact(string(raw), req.Secret.Value(), req.NewSecret.Value()))
}

// scrub removes the secrets of req from an error's text, whatever produced it.
func scrub(err error, req Request) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	e.Message = Redact(e.Message, req.Secret.Value(), req.NewSecret.Value())
	return e
}

// neverConnected reports whether err is a failure to connect (dial refused or
// unreachable, or a name that does not resolve): no byte of the request left.
func neverConnected(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}
