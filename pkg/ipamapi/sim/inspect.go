package sim

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"

	"github.com/pkg/errors"
)

// Stats are counters since New or the last Reset.
type Stats struct {
	// Requests counts requests by route and HTTP status; status 0 means the connection
	// was closed without an answer (down, dropped before or after processing).
	Requests map[Route]map[int]int `json:"requests"`
	// OverlappingRegistrations counts POSTs that arrived for a (triple, zone, family)
	// while another POST of the same key was still between lookup and commit — the
	// pattern that leaks addresses on the real server. A correct client keeps it 0.
	OverlappingRegistrations int `json:"overlapping_registrations"`
	InjectedErrors           int `json:"injected_errors"`
	DroppedBefore            int `json:"dropped_before"`
	DroppedAfter             int `json:"dropped_after"`
	DownRejections           int `json:"down_rejections"`
	Sweeps                   int `json:"sweeps"`
	ExpiredHolders           int `json:"expired_holders"`
	FreedAddresses           int `json:"freed_addresses"`
	// Freed counts, by address (as registered: "10.0.0.1/32"), how often the cleanup
	// worker freed it: an address the stand-in holds no record of was freed, or never
	// registered.
	Freed map[string]int `json:"freed,omitempty"`
	// BackendFailures counts answers produced by a backend fault (NetBoxDown,
	// PrefixesLoading or Config.PrefixLoadDelay for a zone and family that has
	// containers, MongoDown).
	BackendFailures int `json:"backend_failures"`
}

// Count returns the number of requests on route answered with status (0 = dropped).
func (st Stats) Count(route Route, status int) int { return st.Requests[route][status] }

// Total returns the number of requests on route, whatever the outcome.
func (st Stats) Total(route Route) int {
	n := 0
	for _, c := range st.Requests[route] {
		n += c
	}
	return n
}

func newStats() Stats { return Stats{Requests: map[Route]map[int]int{}} }

func (s *Server) record(rt Route, status int, outcome string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.stats.Requests[rt]
	if m == nil {
		m = map[int]int{}
		s.stats.Requests[rt] = m
	}
	m[status]++
	switch outcome {
	case "down":
		s.stats.DownRejections++
	case "dropped-before":
		s.stats.DroppedBefore++
	case "dropped-after":
		s.stats.DroppedAfter++
	case "injected-error":
		s.stats.InjectedErrors++
	case outcomeNetBoxDown, outcomePrefixesLoading, outcomeMongoDown:
		s.stats.BackendFailures++
	}
}

// Stats returns a copy of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.stats
	out.Requests = make(map[Route]map[int]int, len(s.stats.Requests))
	for rt, m := range s.stats.Requests {
		out.Requests[rt] = maps.Clone(m)
	}
	out.Freed = maps.Clone(s.stats.Freed)
	return out
}

// Registrations returns every address record in insertion order, with the derived
// Holder.State and Registration.State (live or expiring).
func (s *Server) Registrations() []Registration {
	s.mu.Lock()
	defer s.mu.Unlock()
	recs := s.st.sorted()
	out := make([]Registration, len(recs))
	for i, r := range recs {
		out[i] = r.public()
	}
	return out
}

// Registration returns the record stored under exactly this address string
// (ip/32 or ip/128).
func (s *Server) Registration(address string) (Registration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.st.byAddr[address]
	if r == nil {
		return Registration{}, false
	}
	return r.public(), true
}

// Holders returns the holders of exactly this address string (with their derived
// State), or nil.
func (s *Server) Holders(address string) []Holder {
	r, _ := s.Registration(address)
	return r.Holders
}

// HeldBy returns the records (insertion order) that list ref as a holder, in any zone.
func (s *Server) HeldBy(ref ServiceRef) []Registration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Registration
	for _, r := range s.st.sorted() {
		if r.holds(ref) {
			out = append(out, r.public())
		}
	}
	return out
}

// Reset forgets every registration, counter, fault and exhaustion switch, and starts
// Config.PrefixLoadDelay again (like a restart of the real server).
// Requests in flight finish against the new, empty state.
func (s *Server) Reset() {
	s.fmu.Lock()
	s.faults = Faults{}
	s.prefixesReadyAt = s.clock.Now().Add(s.prefixLoadDelay)
	s.fmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st = newStore()
	s.stats = newStats()
	s.exhausted = map[string]bool{}
	s.persistLocked()
}

// ExportState returns the registry in its persisted form (secret hashes only).
func (s *Server) ExportState() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.export()
}

// ImportState replaces the registry with st.
func (s *Server) ImportState(st State) error {
	ns, err := importStore(st)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st = ns
	return nil
}

// persistLocked writes the state file if one is configured. Called with s.mu held, so
// writes happen in commit order.
func (s *Server) persistLocked() {
	if s.stateFile == "" {
		return
	}
	if err := SaveStateFile(s.stateFile, s.st.export()); err != nil {
		s.log.Error("saving state file failed", "path", s.stateFile, "error", err.Error())
	}
}

// SaveStateFile writes st to path atomically (temp file in the same directory, fsync,
// rename), mode 0600.
func SaveStateFile(path string, st State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return errors.Wrap(err, "encoding state")
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return errors.Wrap(err, "creating temporary state file")
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		_ = tmp.Close()
		return errors.Wrap(err, "writing temporary state file")
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return errors.Wrap(err, "syncing temporary state file")
	}
	if err := tmp.Close(); err != nil {
		return errors.Wrap(err, "closing temporary state file")
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return errors.Wrap(err, "replacing state file")
	}
	return nil
}

// LoadStateFile reads a state file written by SaveStateFile. A missing file gives an
// error that matches os.ErrNotExist.
func LoadStateFile(path string) (State, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return State{}, errors.Wrapf(err, "reading state file %s", path)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return State{}, errors.Wrapf(err, "decoding state file %s", path)
	}
	return st, nil
}
