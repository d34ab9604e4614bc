package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

// supervisor keeps the manager running, as the Deployment's kubelet would: when the
// process dies it says so (how it ended, its last log lines) and starts it again (its
// webhooks routed to the new process), with a growing pause if it keeps dying. With
// restart false it only says so.
type supervisor struct {
	cp      *localcluster.ControlPlane
	restart bool

	mu  sync.Mutex
	mgr *localcluster.Manager
}

func (s *supervisor) current() *localcluster.Manager {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mgr
}

// watch runs until ctx ends.
func (s *supervisor) watch(ctx context.Context) {
	pause := time.Second
	for {
		mgr := s.current()
		select {
		case <-ctx.Done():
			return
		case <-mgr.Done():
		}
		if ctx.Err() != nil {
			return // stopping: the quickstart ends it
		}
		_, err := mgr.Exited()
		how := "exit status 0"
		if err != nil {
			how = err.Error()
		}
		step("The manager (pid %d) died (%s). The last lines of its log %s:", mgr.Pid(), how, mgr.LogFile)
		fmt.Print(indent(mgr.Tail(10)))
		if !s.restart {
			step("Not restarting it (--no-restart): webhooks refuse pool edits and LoadBalancer Services until the quickstart runs again")
			return
		}
		for {
			step("Restarting the manager")
			next, err := s.cp.StartManager(ctx, nil)
			if err == nil {
				s.mu.Lock()
				s.mgr = next
				s.mu.Unlock()
				step("The manager runs again (pid %d, log %s)", next.Pid(), next.LogFile)
				step("Its metrics: curl -s %s", next.MetricsURL)
				pause = time.Second
				break
			}
			if ctx.Err() != nil {
				return
			}
			step("Starting the manager failed (%v); trying again in %s", err, pause)
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, 30*time.Second)
		}
	}
}

// stop ends the manager that runs now.
func (s *supervisor) stop() { s.current().Stop() }
