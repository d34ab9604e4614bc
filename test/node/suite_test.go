package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

var (
	paths     localcluster.Paths
	nodePaths localcluster.NodePaths
	// cp is the node's control plane, node the node; workDir holds their files.
	cp      *localcluster.ControlPlane
	node    *localcluster.Node
	workDir string
	// namespaces are the node's and the client host's network namespaces.
	namespaces localcluster.NodeNamespaces
)

const timeout = 3 * time.Minute

// TestMain runs the suite again inside network namespaces of its own, then starts one
// control plane and one node for every test.
func TestMain(m *testing.M) {
	if _, inside := localcluster.InNodeNamespace(); !inside {
		code, err := localcluster.RunInNodeNamespace("vitistack-node")
		if err != nil {
			fmt.Fprintln(os.Stderr, "test/node:", err)
		}
		os.Exit(code)
	}
	os.Exit(run(m))
}

func run(m *testing.M) (code int) {
	var ok bool
	paths, ok = localcluster.PathsFromEnv()
	var nodeOK bool
	if nodePaths, nodeOK = localcluster.NodePathsFromEnv(); !ok || !nodeOK {
		fmt.Fprintln(os.Stderr, "test/node: run through 'make test-node', which builds the node's programs and images")
		return 1
	}
	namespaces, _ = localcluster.InNodeNamespace()
	var err error
	if workDir, err = os.MkdirTemp("", "node-"); err != nil {
		fmt.Fprintln(os.Stderr, "test/node:", err)
		return 1
	}
	code = 1
	defer func() {
		if code == 0 {
			_ = os.RemoveAll(workDir)
		} else {
			fmt.Fprintf(os.Stderr, "test/node: the control plane's and the node's logs are in %s\n", workDir)
		}
	}()
	start := time.Now()
	if cp, err = localcluster.StartNodeControlPlane(workDir, "cp", paths, localcluster.NodeIP); err != nil {
		fmt.Fprintln(os.Stderr, "test/node: starting the control plane:", err)
		return code
	}
	defer cp.Stop()
	node, err = localcluster.StartNode(workDir, cp, nodePaths)
	// Stopped, the node leaves nothing on the machine, whatever the tests did.
	defer func() {
		if node == nil {
			return
		}
		node.Stop()
		if left := node.Leftovers(); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "test/node: the node left on the machine:\n  %s\n", strings.Join(left, "\n  "))
			code = 1
		}
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/node: starting the node:", err)
		return code
	}
	fmt.Printf("test/node: control plane and node Ready in %s (files in %s)\n", time.Since(start).Round(time.Second), workDir)
	return m.Run()
}

func newG(t *testing.T) *WithT {
	g := NewWithT(t)
	g.SetDefaultEventuallyTimeout(timeout)
	g.SetDefaultEventuallyPollingInterval(250 * time.Millisecond)
	return g
}

// testDir is a directory for one test's files, kept with the suite's on failure.
func testDir(t *testing.T) string {
	dir := filepath.Join(workDir, strings.ReplaceAll(t.Name(), "/", "_"))
	newG(t).Expect(os.MkdirAll(dir, 0o700)).To(Succeed())
	return dir
}
