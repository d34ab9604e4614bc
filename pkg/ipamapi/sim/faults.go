package sim

import (
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pkg/errors"
)

// Route names a route of the real API (plus the catch-all and gin's trailing-slash
// redirect). Used for statistics and to restrict faults.
type Route string

// Routes of the stand-in.
const (
	RouteRegister       Route = "POST /v2/address"
	RouteRelease        Route = "DELETE /v2/service"
	RouteLegacyRegister Route = "POST /"
	RouteLegacyRelease  Route = "DELETE /"
	RouteCatchAll       Route = "catch-all"
	RouteRedirect       Route = "trailing-slash-redirect"
)

// DropMode says when an injected connection drop happens.
type DropMode int

const (
	// DropBefore closes the connection before the request is processed: nothing
	// happens on the server.
	DropBefore DropMode = iota
	// DropAfter processes and commits the request (registration or release) and then
	// closes the connection instead of answering.
	DropAfter
)

// Faults is the fault-injection setting. The zero value injects nothing.
//
// For each request the order is:
//  1. Down: the connection is closed (every route).
//  2. drop-before (DropBeforeNext, then DropBeforeRate): the connection is closed.
//  3. injected error (ErrorNext, then ErrorRate): ErrorStatus and ErrorBody.
//  4. processing. On the live routes (POST /v2/address, DELETE /v2/service and the
//     legacy POST / and DELETE /) this is the real handler's order:
//     a. body not decodable: 400 "Could not parse incomming request";
//     b. NetBoxDown: 400 "failed to fetch zones: <NetBoxBody>" (the real ValidateRequest
//     reads the zone list from NetBox before any other check);
//     c. validation steps 2-6, where PrefixesLoading (or the first
//     Config.PrefixLoadDelay after start or Reset) makes step 6 answer
//     "no prefixes found for zone <zone> with IP family <family>" for every zone;
//     d. MongoDown: after MongoHang, POST answers 500 "failed to query address
//     documents: server selection error: ..." and DELETE 404 "Could not deregister
//     service: failed to read address document: server selection error: ...";
//     e. lookup, Latency, commit.
//     Latency is also added before the answers of a to d. Nothing is committed by a to d.
//  5. drop-after (DropAfterNext, then DropAfterRate): whatever step 4 did stays done,
//     the connection is closed instead of answering.
//
// One-shot counters (…Next) are consumed before the rates are rolled. Routes restricts
// steps 2, 3 and 5 and Latency; Down and the backend faults (NetBoxDown,
// PrefixesLoading, MongoDown), which are states of the server rather than of a request,
// ignore it.
type Faults struct {
	// Latency plus a uniform random extra in [0, LatencyJitter] is added to every
	// matching request; for register/release it sits between lookup and commit (the
	// real server's slow NetBox call), otherwise before the answer. Real time.
	Latency       time.Duration `json:"-"`
	LatencyJitter time.Duration `json:"-"`
	// ErrorRate (0..1) answers matching requests with ErrorStatus (default 500),
	// ErrorBody and ErrorContentType (default "application/json; charset=utf-8")
	// without processing them. ErrorNext does the same for the next N requests.
	ErrorRate        float64 `json:"error_rate,omitempty"`
	ErrorNext        int     `json:"error_next,omitempty"`
	ErrorStatus      int     `json:"error_status,omitempty"`
	ErrorBody        string  `json:"error_body,omitempty"`
	ErrorContentType string  `json:"error_content_type,omitempty"`
	// DropBeforeRate / DropBeforeNext close the connection without processing.
	DropBeforeRate float64 `json:"drop_before_rate,omitempty"`
	DropBeforeNext int     `json:"drop_before_next,omitempty"`
	// DropAfterRate / DropAfterNext commit the request, then close the connection.
	DropAfterRate float64 `json:"drop_after_rate,omitempty"`
	DropAfterNext int     `json:"drop_after_next,omitempty"`
	// Down closes the connection of every request on every route (like an unreachable
	// backend behind a gateway), regardless of Routes.
	Down bool `json:"down,omitempty"`
	// NetBoxDown makes every POST and DELETE on the live routes whose body decodes
	// answer 400 {"message":"failed to fetch zones: <NetBoxBody>"}: the real server
	// reads the zone list from NetBox on every request, before it validates anything.
	// NetBoxBody is the text NetBox (or the proxy in front of it) answered, as the real
	// server's HTTP client returns it (whitespace-trimmed); empty means
	// DefaultNetBoxBody. For a NetBox that cannot be connected to at all, use the Go
	// transport error, e.g. `Get "https://netbox.example/api/...": dial tcp
	// 10.0.0.7:443: connect: connection refused`.
	NetBoxDown bool   `json:"netbox_down,omitempty"`
	NetBoxBody string `json:"netbox_body,omitempty"`
	// PrefixesLoading makes validation step 6 fail for every zone and family, as right
	// after a restart of the real server, whose zone containers are loaded
	// asynchronously: 400 "no prefixes found for zone <zone> with IP family <family>".
	// Config.PrefixLoadDelay does the same for a while after start and Reset.
	PrefixesLoading bool `json:"prefixes_loading,omitempty"`
	// MongoDown makes requests that pass validation wait MongoHang (the real driver's
	// server selection timeout is 30s) and then fail: POST with 500
	// "failed to query address documents: <MongoSelectionError>", DELETE with 404
	// "Could not deregister service: failed to read address document: <MongoSelectionError>".
	MongoDown bool          `json:"mongo_down,omitempty"`
	MongoHang time.Duration `json:"-"`
	// MongoRecovers makes a request that hangs on MongoDown go on when MongoDown is
	// cleared within its MongoHang, as the real server's driver does when MongoDB comes
	// back during server selection: the request is carried out late (its answer reaches a
	// client that may have given up long before). The real server was seen registering an
	// address 29.4 s after the request was sent, with MongoDB down for under 30 s.
	MongoRecovers bool `json:"mongo_recovers,omitempty"`
	// Routes restricts the per-request faults (drops, injected errors, Latency) to
	// these routes; empty means all routes.
	Routes []Route `json:"routes,omitempty"`
}

// DefaultNetBoxBody is Faults.NetBoxBody when it is empty: the page ingress-nginx
// answers (503) for a NetBox without ready endpoints, trimmed like the real server's
// HTTP client (resty) does.
const DefaultNetBoxBody = "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n" +
	"<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>"

// MongoSelectionError is the MongoDB Go driver's error after its 30s server selection
// timeout when the database (the chart's ipam-system-mongodb service) refuses
// connections; Faults.MongoDown answers with it.
const MongoSelectionError = "server selection error: server selection timeout, current topology: { Type: Unknown, " +
	"Servers: [{ Addr: ipam-system-mongodb:27017, Type: Unknown, Last error: dial tcp 10.96.112.34:27017: connect: connection refused }, ] }"

// durationField is a Faults field that travels in JSON as a Go duration string.
type durationField struct {
	name string
	d    *time.Duration
}

func (f *Faults) durationFields() []durationField {
	return []durationField{{"latency", &f.Latency}, {"latency_jitter", &f.LatencyJitter}, {"mongo_hang", &f.MongoHang}}
}

// MarshalJSON encodes durations as Go duration strings ("150ms").
func (f Faults) MarshalJSON() ([]byte, error) {
	type plain Faults
	b, err := json.Marshal(plain(f))
	if err != nil {
		return nil, errors.Wrap(err, "encoding faults")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, errors.Wrap(err, "encoding faults")
	}
	for _, d := range f.durationFields() {
		if *d.d != 0 {
			m[d.name] = json.RawMessage(strconv.Quote(d.d.String()))
		}
	}
	b, err = json.Marshal(m)
	return b, errors.Wrap(err, "encoding faults")
}

// UnmarshalJSON accepts durations as Go duration strings ("150ms", "2s").
func (f *Faults) UnmarshalJSON(b []byte) error {
	type plain Faults
	var in plain
	if err := json.Unmarshal(b, &in); err != nil {
		return errors.Wrap(err, "decoding faults")
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return errors.Wrap(err, "decoding faults")
	}
	*f = Faults(in)
	for _, d := range f.durationFields() {
		var s string
		if v, ok := raw[d.name]; ok {
			if err := json.Unmarshal(v, &s); err != nil {
				return errors.Wrapf(err, "decoding faults: %s must be a duration string like \"150ms\"", d.name)
			}
		}
		if s == "" {
			continue
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return errors.Wrapf(err, "decoding faults: %s %q", d.name, s)
		}
		*d.d = v
	}
	return nil
}

// FaultFields lists the JSON names of every Faults field (what PUT /faults accepts).
func FaultFields() []string {
	var out []string
	t := reflect.TypeFor[Faults]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	for _, d := range (&Faults{}).durationFields() {
		out = append(out, d.name)
	}
	slices.Sort(out)
	return out
}

func (f *Faults) validate() error {
	for _, r := range []float64{f.ErrorRate, f.DropBeforeRate, f.DropAfterRate} {
		if r < 0 || r > 1 {
			return errors.Errorf("rate %v out of range 0..1", r)
		}
	}
	if f.Latency < 0 || f.LatencyJitter < 0 {
		return errors.New("negative latency")
	}
	if f.MongoHang < 0 {
		return errors.New("negative mongo_hang")
	}
	if f.ErrorStatus != 0 && (f.ErrorStatus < 100 || f.ErrorStatus > 999) {
		return errors.Errorf("invalid error status %d", f.ErrorStatus)
	}
	if f.ErrorNext < 0 || f.DropBeforeNext < 0 || f.DropAfterNext < 0 {
		return errors.New("negative one-shot counter")
	}
	return nil
}

// decision is what the faults mean for one request.
type decision struct {
	latency    time.Duration
	down       bool
	dropBefore bool
	dropAfter  bool
	fail       bool
	status     int
	body       string
	ctype      string
	backend    backendState
}

// backendState is the state of the real server's own dependencies for one request.
type backendState struct {
	netboxDown      bool
	netboxBody      string
	prefixesLoading bool
	mongoDown       bool
	mongoHang       time.Duration
	mongoRecovers   bool
}

// SetFaults replaces the whole fault setting.
func (s *Server) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	f.Routes = slices.Clone(f.Routes)
	s.fmu.Lock()
	defer s.fmu.Unlock()
	s.faults = f
	return nil
}

// Faults returns the current fault setting (one-shot counters show what is left).
func (s *Server) Faults() Faults {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	f := s.faults
	f.Routes = slices.Clone(f.Routes)
	return f
}

// ClearFaults removes every injected fault, the backend faults included (exhaustion
// switches and a running Config.PrefixLoadDelay are kept).
func (s *Server) ClearFaults() {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	s.faults = Faults{}
}

func (s *Server) updateFaults(fn func(f *Faults)) error {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	f := s.faults
	fn(&f)
	if err := f.validate(); err != nil {
		return err
	}
	s.faults = f
	return nil
}

// SetLatency sets the injected latency and jitter.
func (s *Server) SetLatency(latency, jitter time.Duration) error {
	return s.updateFaults(func(f *Faults) { f.Latency, f.LatencyJitter = latency, jitter })
}

// SetErrorRate answers a fraction (0..1) of requests with status and body (body is
// written as is with Content-Type application/json; charset=utf-8). status 0 means 500.
func (s *Server) SetErrorRate(rate float64, status int, body string) error {
	return s.updateFaults(func(f *Faults) { f.ErrorRate, f.ErrorStatus, f.ErrorBody = rate, status, body })
}

// FailNext answers the next n matching requests with status and body.
func (s *Server) FailNext(n, status int, body string) error {
	return s.updateFaults(func(f *Faults) { f.ErrorNext, f.ErrorStatus, f.ErrorBody = n, status, body })
}

// SetDropRate makes a fraction (0..1) of requests lose their connection, before or
// after processing.
func (s *Server) SetDropRate(mode DropMode, rate float64) error {
	return s.updateFaults(func(f *Faults) {
		if mode == DropAfter {
			f.DropAfterRate = rate
		} else {
			f.DropBeforeRate = rate
		}
	})
}

// DropNext makes the next n matching requests lose their connection.
func (s *Server) DropNext(mode DropMode, n int) error {
	return s.updateFaults(func(f *Faults) {
		if mode == DropAfter {
			f.DropAfterNext = n
		} else {
			f.DropBeforeNext = n
		}
	})
}

// SetDown closes the connection of every request while down is true.
func (s *Server) SetDown(down bool) {
	_ = s.updateFaults(func(f *Faults) { f.Down = down })
}

// SetNetBoxDown makes every live request answer 400 "failed to fetch zones: <body>"
// while down is true (see Faults.NetBoxDown); body "" means DefaultNetBoxBody.
func (s *Server) SetNetBoxDown(down bool, body string) {
	_ = s.updateFaults(func(f *Faults) { f.NetBoxDown, f.NetBoxBody = down, body })
}

// SetPrefixesLoading makes validation answer 400 "no prefixes found for zone ..." for
// every zone and family while loading is true (see Faults.PrefixesLoading).
func (s *Server) SetPrefixesLoading(loading bool) {
	_ = s.updateFaults(func(f *Faults) { f.PrefixesLoading = loading })
}

// SetMongoDown makes requests that pass validation fail as with an unreachable MongoDB,
// each after hang (see Faults.MongoDown).
func (s *Server) SetMongoDown(down bool, hang time.Duration) error {
	return s.updateFaults(func(f *Faults) { f.MongoDown, f.MongoHang = down, hang })
}

// PrefixesLoaded reports whether the zone containers count as loaded: false while
// Faults.PrefixesLoading is set or within Config.PrefixLoadDelay of start or Reset.
func (s *Server) PrefixesLoaded() bool {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	return !s.prefixesLoadingLocked()
}

func (s *Server) prefixesLoadingLocked() bool {
	return s.faults.PrefixesLoading || s.clock.Now().Before(s.prefixesReadyAt)
}

// SetFaultRoutes restricts the per-request faults (not Down nor the backend faults) to
// the given routes; none means all.
func (s *Server) SetFaultRoutes(routes ...Route) {
	_ = s.updateFaults(func(f *Faults) { f.Routes = slices.Clone(routes) })
}

func (s *Server) decide(route Route) decision {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	f := &s.faults
	d := decision{down: f.Down, backend: backendState{
		netboxDown: f.NetBoxDown, netboxBody: f.NetBoxBody, prefixesLoading: s.prefixesLoadingLocked(),
		mongoDown: f.MongoDown, mongoHang: f.MongoHang, mongoRecovers: f.MongoRecovers,
	}}
	if d.backend.netboxBody == "" {
		d.backend.netboxBody = DefaultNetBoxBody
	}
	if d.down || (len(f.Routes) > 0 && !slices.Contains(f.Routes, route)) {
		return d
	}
	d.latency = f.Latency
	if f.LatencyJitter > 0 {
		d.latency += time.Duration(s.rnd.Int64N(int64(f.LatencyJitter) + 1))
	}
	roll := func(next *int, rate float64) bool {
		if *next > 0 {
			*next--
			return true
		}
		return rate > 0 && s.rnd.Float64() < rate
	}
	switch {
	case roll(&f.DropBeforeNext, f.DropBeforeRate):
		d.dropBefore = true
	case roll(&f.ErrorNext, f.ErrorRate):
		d.fail = true
		d.status, d.body, d.ctype = f.ErrorStatus, f.ErrorBody, f.ErrorContentType
		if d.status == 0 {
			d.status = http.StatusInternalServerError
		}
		if d.ctype == "" {
			d.ctype = contentTypeJSON
		}
	case roll(&f.DropAfterNext, f.DropAfterRate):
		d.dropAfter = true
	}
	return d
}

// SetExhausted makes (zone, family) behave as if NetBox had no free address left in
// any of its containers: case A (and case C, which also asks NetBox for a container
// with room) answers 500 "...no available prefix found for zone <zone>_v4|_v6".
func (s *Server) SetExhausted(zone, family string, exhausted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := zoneKey(zone, family)
	if exhausted {
		s.exhausted[key] = true
	} else {
		delete(s.exhausted, key)
	}
}

// zoneKey is the real server's cache key: zone + "_v" + last character of the family.
func zoneKey(zone, family string) string {
	if family == "" {
		return zone + "_v"
	}
	return zone + "_v" + family[len(family)-1:]
}
