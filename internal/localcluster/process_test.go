package localcluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// listenEnv makes this test binary, started as a child, serve HTTP on the address it
// names (as a manager serves its probes), or end with net.Listen's error.
const listenEnv = "LOCALCLUSTER_TEST_LISTEN"

func TestMain(m *testing.M) {
	if addr := os.Getenv(listenEnv); addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		srv := &http.Server{ReadHeaderTimeout: time.Second}
		_ = srv.Serve(ln)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A process whose port was taken between its choice and its listen is started again on
// new ports, and then serves; any other early end is reported at once.
func TestAProcessWhosePortWasTakenStartsAgain(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	serve := func(ports []int) (*Process, error) {
		p, err := startProcess(dir, "server", nil, []string{listenEnv + "=" + hostPort(ports[0])}, self)
		if err != nil {
			return nil, err
		}
		url := httpURL(ports[0]) + "/"
		// A short timeout: the port's other holder accepts connections but never answers.
		client := &http.Client{Timeout: 200 * time.Millisecond}
		err = waitFor(p, 30*time.Second, "an answer on "+url, func() error {
			resp, err := client.Get(url) //nolint:noctx // a test's local request
			if err == nil {
				_ = resp.Body.Close()
			}
			return err
		})
		if err != nil {
			p.Kill()
			return nil, err
		}
		return p, nil
	}

	starts := 0
	var served *Process
	err = onFreePorts(1, func(ports []int) error {
		starts++
		if starts == 1 { // another process takes the port first
			ln, err := net.Listen("tcp", hostPort(ports[0]))
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
		}
		p, err := serve(ports)
		served = p
		return err
	})
	if err != nil {
		t.Fatalf("the process did not serve: %v", err)
	}
	defer served.Kill()
	if starts != 2 {
		t.Fatalf("started %d times, want 2: once on the taken port, once on a new one", starts)
	}

	// An end for any other reason is not retried, though an earlier process of the
	// name logged a taken port.
	starts = 0
	err = onFreePorts(1, func([]int) error {
		starts++
		p, err := startProcess(dir, "server", nil, []string{listenEnv + "=not-an-address"}, self)
		if err != nil {
			return err
		}
		return waitFor(p, 30*time.Second, "an answer", func() error { return context.DeadlineExceeded })
	})
	if err == nil || starts != 1 {
		t.Fatalf("a process that fails for another reason: started %d times, error %v; want once, with its error", starts, err)
	}
}
