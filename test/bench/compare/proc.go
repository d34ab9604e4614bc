package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pkg/errors"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat: 100 on
// every Linux platform Go runs on.
const clockTicks = 100

// cpuTime is the user and system CPU time a process has used so far.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)) //nolint:gosec // built from a pid
	if err != nil {
		return 0, err
	}
	// "pid (comm) state ppid ...": comm may hold spaces, so split after its ')'. The
	// fields after it start with state (field 3): utime and stime are fields 14 and 15.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, errors.Errorf("short /proc/%d/stat", pid)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, errors.Wrapf(err, "/proc/%d/stat", pid)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// memory returns a process's peak resident set (VmHWM) and its current one (VmRSS), in
// bytes.
func memory(pid int) (peak, now uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)) //nolint:gosec // built from a pid
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok || (key != "VmHWM" && key != "VmRSS") {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, 0, errors.Wrapf(err, "/proc/%d/status %s", pid, key)
		}
		if key == "VmHWM" {
			peak = kb * 1024
		} else {
			now = kb * 1024
		}
	}
	return peak, now, nil
}

// controlPlaneComponents are the processes of a control plane whose CPU a run reports.
var controlPlaneComponents = []string{"kube-apiserver", "etcd", "kube-controller-manager"}

// controlPlaneCPU is the CPU time each process of the control plane in dir has used so
// far, found by its command line (which names a file in dir).
func controlPlaneCPU(dir string) (map[string]time.Duration, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[string]time.Duration{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !strings.Contains(string(b), dir) {
			continue
		}
		argv0, _, _ := strings.Cut(string(b), "\x00")
		for _, c := range controlPlaneComponents {
			if strings.HasSuffix(argv0, "/"+c) {
				if t, err := cpuTime(pid); err == nil {
					out[c] += t
				}
			}
		}
	}
	return out, nil
}

// cpuSince is what each process used between two readings of controlPlaneCPU.
func cpuSince(before, after map[string]time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	for k, v := range after {
		out[k] = v - before[k]
	}
	return out
}

// formatCPU lists the components' CPU seconds in controlPlaneComponents' order.
func formatCPU(m map[string]time.Duration) string {
	parts := make([]string, 0, len(controlPlaneComponents))
	for _, c := range controlPlaneComponents {
		parts = append(parts, fmt.Sprintf("%s %.1f s", c, m[c].Seconds()))
	}
	return strings.Join(parts, ", ")
}
