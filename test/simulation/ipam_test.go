package simulation

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/pkg/errors"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// maxCompletion is the longest the simulated IPAM-API takes to carry out a request that
// stalled (its MongoDB or NetBox slow): a held request lands at any moment up to this
// long after it was sent, before or after the provider gave up on it. The provider's
// quarantine must be longer.
const maxCompletion = 45 * time.Second

// ipam is the IPAM-API: the stand-in, reached in process through a transport that is a
// step of the scheduler, where the IPAM-API's faults strike.
type ipam struct {
	w   *world
	api *sim.Server
	// held are requests that stalled in the IPAM-API: each lands (is carried out) at its
	// time, its answer long given up on.
	held []heldRequest
	// served counts the requests carried out.
	served int
}

type heldRequest struct {
	at   time.Time
	what string
	req  *http.Request
	body []byte
}

// For implements registrar.ClientFactory.
func (i *ipam) For(endpoint string, _ []byte) (ipamapi.Client, error) {
	return ipamapi.NewClient(endpoint, ipamapi.Options{Timeout: i.w.options.IPAMAPITimeout, Transport: i})
}

// RoundTrip is one request of a process: a step before it reaches the IPAM-API, and one
// before its answer reaches the process.
func (i *ipam) RoundTrip(r *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	what := describeRequest(r, body)
	s := i.w.s
	f := s.yield(point{kind: pointIPAM, what: what})
	if f != faultDied {
		i.overlaps(r, body, what)
	}
	switch f {
	case faultDied:
		return nil, context.Canceled
	case faultDropped:
		s.log("  fault: %s never reaches the IPAM-API", what)
		return nil, errors.New("read: connection reset by peer")
	case fault5xx:
		s.log("  fault: %s answered 503", what)
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"text/plain"}},
			Body: io.NopCloser(bytes.NewReader([]byte("upstream connect error or disconnect/reset before headers"))), Request: r}, nil
	case faultHeld:
		at := s.clock.now.Add(time.Duration(s.rng.Int64N(int64(maxCompletion))))
		s.log("  fault: %s stalls in the IPAM-API, carried out at +%s", what, at.Sub(s.clock.now))
		i.held = append(i.held, heldRequest{at: at, what: what, req: r, body: body})
		// The provider waits its request timeout for an answer that does not come.
		s.clock.Sleep(i.w.options.IPAMAPITimeout)
		return nil, context.DeadlineExceeded
	case faultNetBox:
		i.api.SetNetBoxDown(true, "")
		defer i.api.SetNetBoxDown(false, "")
		s.log("  fault: NetBox is down for %s", what)
	case faultInvalidZone:
		zone := zoneOf(body)
		if err := i.api.FailNext(1, http.StatusBadRequest, fmt.Sprintf(`{"message":"invalid zone '%s', must be one of: 'inet', 'hnet-private', 'hnet-public'"}`, zone)); err != nil {
			panic(err)
		}
		s.log("  fault: NetBox answers a zone list without %s for %s", zone, what)
	}
	res := i.serve(r, body)
	if f == faultLost {
		s.log("  fault: the answer to %s (%d) is lost", what, res.StatusCode)
		return nil, errors.New("read: connection reset by peer")
	}
	if s.yield(point{kind: pointIPAM, what: "answer to " + what}) == faultDied {
		return nil, context.Canceled
	}
	return res, nil
}

// overlaps fails the run when a request reaches the IPAM-API while a request of the same
// identity that got no answer may still be carried out, and the two could leave the identity
// holding an address no record names, or a record naming an address nothing holds: a
// registration of any address meeting any other registration of the identity (each allocates
// one, or the second takes an address the first then adds to), a release meeting a
// registration of its address (which then holds it again for good), or a registration
// meeting a release of its address (which then frees what was just registered). The provider
// promises to send none of them; two registrations of one address (a resend), and two
// releases, are harmless. The real IPAM-API does not serialise requests.
func (i *ipam) overlaps(r *http.Request, body []byte, what string) {
	var mine wireRequest
	_ = json.Unmarshal(body, &mine)
	id := identityOf(body)
	for _, h := range i.held {
		var held wireRequest
		_ = json.Unmarshal(h.body, &held)
		if identityOf(h.body) != id || i.w.failed != "" {
			continue
		}
		var harmful bool
		switch {
		case h.req.Method == http.MethodDelete && r.Method == http.MethodPost:
			// A pool's subnet check registers its address only to release it again: nothing is
			// bound to it, and a release of it that frees it early takes nothing from anyone.
			harmful = (mine.Address == "" || mine.Address == held.Address) && mine.Service.ServiceName != subnetProbe
		case h.req.Method == http.MethodDelete:
		case r.Method == http.MethodDelete:
			harmful = held.Address == "" || held.Address == mine.Address
		default:
			// Two explicit addresses: each is recorded by its claim (one address twice: a resend).
			harmful = mine.Address == "" || held.Address == ""
		}
		if harmful {
			i.w.failed = fmt.Sprintf("%s reaches the IPAM-API while %s, sent without an answer, may still be carried out "+
				"(it lands at +%s)", what, h.what, h.at.Sub(i.w.s.clock.now))
		}
	}
}

func (i *ipam) serve(r *http.Request, body []byte) *http.Response {
	i.served++
	rec := httptest.NewRecorder()
	req := r.Clone(context.Background())
	req.Body = io.NopCloser(bytes.NewReader(body))
	i.api.ServeHTTP(rec, req)
	res := rec.Result()
	res.Request = r
	return res
}

// land carries out the held requests that are due, in order; it reports what landed.
func (i *ipam) land() []string {
	var out []string
	kept := i.held[:0]
	for _, h := range i.held {
		if i.w.s.clock.now.Before(h.at) {
			kept = append(kept, h)
			continue
		}
		res := i.serve(h.req, h.body)
		_ = res.Body.Close()
		out = append(out, fmt.Sprintf("%s lands late: %d", h.what, res.StatusCode))
	}
	i.held = kept
	return out
}

// nextLanding is the time of the next held request (zero: none).
func (i *ipam) nextLanding() time.Time {
	var out time.Time
	for _, h := range i.held {
		if out.IsZero() || h.at.Before(out) {
			out = h.at
		}
	}
	return out
}

// subnetProbe is the service name a subnet-mode pool's check of its subnet registers under.
const subnetProbe = "vitistack-ipam-subnet-probe"

type wireRequest struct {
	Zone     string `json:"zone"`
	IPFamily string `json:"ip_family"`
	Address  string `json:"address"`
	Service  struct {
		ServiceName string `json:"service_name"`
		NamespaceID string `json:"namespace_id"`
		ClusterID   string `json:"cluster_id"`
		Retention   int    `json:"retention_period_days"`
	} `json:"service"`
}

// identityOf is the IPAM-API identity a request is for, in its zone and family: two
// registrations of one identity that overlap in the IPAM-API each allocate an address.
func identityOf(body []byte) string {
	var w wireRequest
	_ = json.Unmarshal(body, &w)
	return fmt.Sprintf("%s/%s/%s in %s %s", w.Service.NamespaceID, w.Service.ServiceName, w.Service.ClusterID, w.Zone, w.IPFamily)
}

func describeRequest(r *http.Request, body []byte) string {
	var w wireRequest
	_ = json.Unmarshal(body, &w)
	verb := map[string]string{http.MethodPost: "register", http.MethodDelete: "release"}[r.Method]
	addr := w.Address
	if addr == "" {
		addr = "any"
	}
	return fmt.Sprintf("%s %s/%s %s in %s", verb, w.Service.NamespaceID, w.Service.ServiceName, addr, w.Zone)
}

func zoneOf(body []byte) string {
	var w wireRequest
	_ = json.Unmarshal(body, &w)
	return w.Zone
}
