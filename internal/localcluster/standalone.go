package localcluster

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pkg/errors"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// This file runs programs without clusterctl: CRDs applied from files and a binary
// started with the arguments the caller chooses (the benchmarks in test/bench/compare
// run this provider and another one so).

// StartProcess starts bin with args and env (added to this process's environment), its
// output appended to <dir>/<name>.log. Stop or Kill it when done.
func StartProcess(dir, name string, env []string, bin string, args ...string) (*Process, error) {
	return startProcess(dir, name, nil, env, bin, args...)
}

// Pid is the process's id, for reading /proc/<pid>.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Tail returns the last n lines of the process's log (or why it cannot be read).
func (p *Process) Tail(n int) string {
	l, err := p.Logs()
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(l, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitReady polls url every 100 ms until it answers 200 OK; it fails when the process
// exits first or after timeout.
func (p *Process) WaitReady(ctx context.Context, url string, timeout time.Duration) error {
	return waitFor(p, timeout, "ready answer on "+url, func() error { return httpOK(ctx, url) })
}

// FreePorts returns n different TCP ports on 127.0.0.1 that were free a moment ago.
func FreePorts(n int) ([]int, error) { return freePorts(n) }

// HostPort is "127.0.0.1:<port>".
func HostPort(port int) string { return hostPort(port) }

// HTTPURL is "http://127.0.0.1:<port>".
func HTTPURL(port int) string { return httpURL(port) }

// InstallCRDs applies every *.yaml file of dirs but kustomization.yaml (CRDs, as
// controller-gen writes them), waits until each CRD is Established, then restarts
// kube-controller-manager so that its garbage collector follows owner references of
// the new types at once (it looks for new types only every 30 s).
func (c *ControlPlane) InstallCRDs(ctx context.Context, dirs ...string) error {
	var files []string
	for _, dir := range dirs {
		found, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if err != nil {
			return errors.Wrapf(err, "listing %s", dir)
		}
		if len(found) == 0 {
			return errors.Errorf("no YAML file in %s", dir)
		}
		for _, f := range found {
			if filepath.Base(f) != "kustomization.yaml" {
				files = append(files, f)
			}
		}
	}
	sort.Strings(files)
	var crds []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return errors.Wrapf(err, "reading %s", f)
		}
		applied, err := c.Apply(ctx, string(b))
		if err != nil {
			return errors.Wrapf(err, "applying %s", f)
		}
		for _, a := range applied {
			if name, ok := strings.CutPrefix(a, "CustomResourceDefinition "); ok {
				crds = append(crds, name)
			}
		}
	}
	for _, name := range crds {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			return established(ctx, c, name), nil
		})
		if err != nil {
			return errors.Wrapf(err, "CustomResourceDefinition %s is not Established", name)
		}
	}
	return c.restartControllerManager()
}

func established(ctx context.Context, c *ControlPlane, name string) bool {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.Client.Get(ctx, types.NamespacedName{Name: name}, crd); err != nil {
		return false
	}
	for _, cond := range crd.Status.Conditions {
		if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
