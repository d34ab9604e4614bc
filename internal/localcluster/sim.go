package localcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/pkg/errors"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// Sim is the IPAM-API stand-in (cmd/ipam-api-sim) running as a process.
type Sim struct {
	*Process
	// URL is the IPAM-API's base URL; DebugURL the stand-in's inspection API.
	URL, DebugURL string
}

// StartSim starts the stand-in on free loopback ports, its log in dir.
func StartSim(dir string, p Paths, also io.Writer, args ...string) (*Sim, error) {
	return StartSimOn(dir, "127.0.0.1", p, also, args...)
}

// StartSimOn starts the stand-in on free ports of host (NodeIP: where a node's Pods
// reach it), its log in dir.
func StartSimOn(dir, host string, p Paths, also io.Writer, args ...string) (*Sim, error) {
	var s *Sim
	err := onFreePorts(2, func(ports []int) error {
		port, debug := ports[0], ports[1]
		listen, debugListen := net.JoinHostPort(host, strconv.Itoa(port)), net.JoinHostPort(host, strconv.Itoa(debug))
		proc, err := startProcess(dir, "ipam-api-sim", also, nil, p.Sim,
			append([]string{"--listen", listen, "--debug-listen", debugListen}, args...)...)
		if err != nil {
			return err
		}
		s = &Sim{Process: proc, URL: "http://" + listen, DebugURL: "http://" + debugListen}
		if err := waitFor(proc, 30*time.Second, "answer on "+s.DebugURL, func() error {
			_, err := s.Stats(context.Background())
			return err
		}); err != nil {
			proc.Kill()
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Registrations returns every address record the stand-in holds.
func (s *Sim) Registrations(ctx context.Context) ([]sim.Registration, error) {
	var regs []sim.Registration
	return regs, s.debug(ctx, http.MethodGet, "/registrations", nil, &regs)
}

// Stats returns the stand-in's request counters.
func (s *Sim) Stats(ctx context.Context) (sim.Stats, error) {
	var st sim.Stats
	return st, s.debug(ctx, http.MethodGet, "/stats", nil, &st)
}

// SetExhausted makes the zone's family answer as exhausted (or not).
func (s *Sim) SetExhausted(ctx context.Context, zone, family string, exhausted bool) error {
	in := map[string]any{"zone": zone, "ip_family": family, "exhausted": exhausted}
	return s.debug(ctx, http.MethodPut, "/exhausted", in, nil)
}

// Sweep runs the stand-in's expiry sweeper now.
func (s *Sim) Sweep(ctx context.Context) error {
	return s.debug(ctx, http.MethodPost, "/sweep", nil, nil)
}

func (s *Sim) debug(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.DebugURL+path, body)
	if err != nil {
		return err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return errors.Wrapf(err, "%s %s", method, path)
	}
	defer resp.Body.Close() //nolint:errcheck // read-only
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return errors.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	if out == nil {
		return nil
	}
	return errors.Wrapf(json.Unmarshal(b, out), "decoding %s", path)
}

// SetFaults replaces the stand-in's faults (sim.Faults{} clears them).
func (s *Sim) SetFaults(ctx context.Context, f sim.Faults) error {
	return s.debug(ctx, http.MethodPut, "/faults", f, nil)
}
