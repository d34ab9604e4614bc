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

// NewSerialized wraps inner, the client for endpoint. Keys blocked by a registration
// whose outcome is unknown stay blocked for quarantine.
func NewSerialized(inner Client, endpoint string, quarantine time.Duration) *Serialized {
	return &Serialized{inner: inner, endpoint: endpoint, quarantine: quarantine, now: time.Now,
		mu: &sync.Mutex{}, busy: map[string]time.Time{}}
}

// Register implements Client.
func (s *Serialized) Register(ctx context.Context, req Request) (*Response, error) {
	key := strings.Join([]string{s.endpoint, req.Zone, string(req.Family),
		req.Identity.ServiceName, req.Identity.NamespaceID, req.Identity.ClusterID}, "\x00")
	s.mu.Lock()
	if until, ok := s.busy[key]; ok && (until.IsZero() || s.now().Before(until)) {
		s.mu.Unlock()
		msg := "an earlier registration for this identity is still in flight"
		if !until.IsZero() {
			msg = "an earlier registration for this identity ended without an answer; waiting until " +
				until.UTC().Format(time.RFC3339) + " before sending another"
		}
		return nil, &Error{Op: "register", Class: ClassTransient, Message: msg}
	}
	s.busy[key] = time.Time{}
	s.mu.Unlock()

	res, err := s.inner.Register(ctx, req)

	s.mu.Lock()
	defer s.mu.Unlock()
	var e *Error
	if err != nil && asError(err, &e) && e.Unknown && s.quarantine > 0 {
		s.busy[key] = s.now().Add(s.quarantine)
	} else {
		delete(s.busy, key)
	}
	return res, err
}

// Release implements Client.
func (s *Serialized) Release(ctx context.Context, req Request) (*Response, error) {
	return s.inner.Release(ctx, req)
}
