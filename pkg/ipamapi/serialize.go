package ipamapi

import (
	"context"
	"strings"
	"sync"
	"time"
)

// Serialized wraps a Client so that no two registrations for one holder (endpoint,
// zone, family and identity) are ever in flight at once. The real IPAM-API does not
// serialise them: simultaneous first registrations of one identity each allocate an
// address, and all but one leak. When a registration ends without an answer (timeout,
// lost connection) it may still complete on the server, so its key stays blocked for
// the quarantine period afterwards. A blocked Register fails at once with a transient
// error; the caller backs off and tries again.
type Serialized struct {
	inner      Client
	endpoint   string
	quarantine time.Duration
	now        func() time.Time

	mu   *sync.Mutex
	busy map[string]time.Time // key -> blocked until (zero: in flight)
}

// The kinds of keys of Serialized.busy: a holder's identity, or an address asked for.
const (
	identityKey = "identity"
	addressKey  = "address"
)

// NewSerialized wraps inner, the client for endpoint. Keys blocked by a registration
// whose outcome is unknown stay blocked for quarantine.
func NewSerialized(inner Client, endpoint string, quarantine time.Duration) *Serialized {
	return &Serialized{inner: inner, endpoint: endpoint, quarantine: quarantine, now: time.Now,
		mu: &sync.Mutex{}, busy: map[string]time.Time{}}
}

// Register implements Client. A request with an address is also held back while
// another for the same address (any identity) is in flight: two simultaneous claims of
// one free address could both be granted.
func (s *Serialized) Register(ctx context.Context, req Request) (*Response, error) {
	keys := []string{strings.Join([]string{identityKey, s.endpoint, req.Zone, string(req.Family),
		req.Identity.ServiceName, req.Identity.NamespaceID, req.Identity.ClusterID}, "\x00")}
	if req.Address != "" {
		if addr, err := CanonicalCIDR(req.Address); err == nil {
			keys = append(keys, strings.Join([]string{addressKey, s.endpoint, req.Zone, addr}, "\x00"))
		}
	}
	s.mu.Lock()
	for _, key := range keys {
		if until, ok := s.busy[key]; ok && (until.IsZero() || s.now().Before(until)) {
			s.mu.Unlock()
			msg := "an earlier registration for this identity or address is still in flight"
			if !until.IsZero() {
				msg = "an earlier registration for this identity or address ended without an answer; waiting until " +
					until.UTC().Format(time.RFC3339) + " before sending another"
			}
			return nil, &Error{Op: "register", Class: ClassTransient, Message: msg, NotSent: true}
		}
	}
	for _, key := range keys {
		s.busy[key] = time.Time{}
	}
	s.mu.Unlock()

	res, err := s.inner.Register(ctx, req)

	s.mu.Lock()
	defer s.mu.Unlock()
	var e *Error
	for _, key := range keys {
		if err != nil && asError(err, &e) && e.Unknown && s.quarantine > 0 {
			s.busy[key] = s.now().Add(s.quarantine)
		} else {
			delete(s.busy, key)
		}
	}
	return res, err
}

// Pending counts the registrations in flight through s and the identities blocked
// after a registration that ended without an answer (quarantined), for metrics.
func (s *Serialized) Pending() (inFlight, quarantined int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for key, until := range s.busy {
		if !strings.HasPrefix(key, identityKey+"\x00") {
			continue // the address of a registration counted by its identity
		}
		switch {
		case until.IsZero():
			inFlight++
		case now.Before(until):
			quarantined++
		}
	}
	return inFlight, quarantined
}

// Release implements Client.
func (s *Serialized) Release(ctx context.Context, req Request) (*Response, error) {
	return s.inner.Release(ctx, req)
}
