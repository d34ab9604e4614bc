package sim

import (
	"encoding/json"
	"net/http"
	"slices"
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
// For each request the order is: Down, drop-before, injected error, processing
// (with Latency between lookup and commit), drop-after. One-shot counters (…Next) are
// consumed before the rates are rolled.
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
	// Routes restricts all faults except Down to these routes; empty means all routes.
	Routes []Route `json:"routes,omitempty"`
}

// MarshalJSON encodes durations as Go duration strings ("150ms").
func (f Faults) MarshalJSON() ([]byte, error) {
	type plain Faults
	out := struct {
		plain
		Latency       string `json:"latency,omitempty"`
		LatencyJitter string `json:"latency_jitter,omitempty"`
	}{plain: plain(f)}
	if f.Latency != 0 {
		out.Latency = f.Latency.String()
	}
	if f.LatencyJitter != 0 {
		out.LatencyJitter = f.LatencyJitter.String()
	}
	b, err := json.Marshal(out)
	return b, errors.Wrap(err, "encoding faults")
}

// UnmarshalJSON accepts durations as Go duration strings ("150ms", "2s").
func (f *Faults) UnmarshalJSON(b []byte) error {
	type plain Faults
	var in struct {
		plain
		Latency       string `json:"latency"`
		LatencyJitter string `json:"latency_jitter"`
	}
	if err := json.Unmarshal(b, &in); err != nil {
		return errors.Wrap(err, "decoding faults")
	}
	*f = Faults(in.plain)
	for _, d := range []struct {
		s   string
		dst *time.Duration
	}{{in.Latency, &f.Latency}, {in.LatencyJitter, &f.LatencyJitter}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil {
			return errors.Wrapf(err, "decoding faults: duration %q", d.s)
		}
		*d.dst = v
	}
	return nil
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

// ClearFaults removes every injected fault (exhaustion switches are kept).
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

// SetFaultRoutes restricts faults (except Down) to the given routes; none means all.
func (s *Server) SetFaultRoutes(routes ...Route) {
	_ = s.updateFaults(func(f *Faults) { f.Routes = slices.Clone(routes) })
}

func (s *Server) decide(route Route) decision {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	f := &s.faults
	d := decision{down: f.Down}
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
