package localcluster

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pkg/errors"
)

// Process is a program started by this package. Its output goes to a log file.
type Process struct {
	Name    string
	LogFile string

	cmd *exec.Cmd
	log *os.File
	// logStart is where this process's output starts in LogFile (a log is appended to).
	logStart int64
	done     chan struct{}
	mu       sync.Mutex
	err      error
}

// startProcess starts bin with args and env (added to this process's environment), its
// output appended to <dir>/<name>.log and copied to also (when not nil).
func startProcess(dir, name string, also io.Writer, env []string, bin string, args ...string) (*Process, error) {
	logFile := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, errors.Wrapf(err, "opening the log of %s", name)
	}
	var logStart int64
	if st, err := f.Stat(); err == nil {
		logStart = st.Size()
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out io.Writer = f
	if also != nil {
		out = io.MultiWriter(f, also)
	}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group (a Ctrl-C in the terminal reaches only the parent, which
	// stops the children in order), and killed if the parent dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, errors.Wrapf(err, "starting %s", bin)
	}
	p := &Process{Name: name, LogFile: logFile, cmd: cmd, log: f, logStart: logStart, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.err
	default:
		return false, nil
	}
}

// Done is closed once the process has ended (Exited tells how).
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop sends SIGTERM and waits up to 20 s, then kills.
func (p *Process) Stop() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.Kill()
	}
}

// Kill ends the process at once, as a crash would, and waits for it.
func (p *Process) Kill() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Logs returns what the process has written so far. An error (the file gone) is
// returned, never an empty log: a test that looks for the absence of a line must not
// pass on a log it could not read.
func (p *Process) Logs() (string, error) {
	b, err := os.ReadFile(p.LogFile)
	if err != nil {
		return "", errors.Wrapf(err, "reading the log of %s", p.Name)
	}
	return string(b), nil
}

// ownLogs is what this process has written, without what earlier ones of its name did.
func (p *Process) ownLogs() string {
	l, err := p.Logs()
	if err != nil {
		return err.Error()
	}
	return l[min(int(p.logStart), len(l)):]
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ports, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// freePorts returns n different TCP ports on 127.0.0.1 that were free a moment ago:
// each is held until all are chosen, so that no two are the same.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, errors.Wrap(err, "finding a free port")
		}
		defer ln.Close() //nolint:errcheck // only its port was needed
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// errPortTaken: a process ended because a port chosen for it was taken meanwhile.
var errPortTaken = errors.New("a port chosen for it was taken before it could listen")

// onFreePorts calls start (which starts a process on the ports it is given and waits
// until it serves) with n ports that were free a moment ago. The kernel hands out the
// same range for outgoing connections, so a port can be taken between the check and the
// process's listen: when the process ends saying so, start runs again on new ports, up
// to three times.
func onFreePorts(n int, start func(ports []int) error) error {
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(n)
		if err != nil {
			return err
		}
		err = start(ports)
		if err == nil || !errors.Is(err, errPortTaken) || attempt == 3 {
			return err
		}
	}
}

// waitFor calls check every 100 ms until it returns nil, the process ends or timeout.
func waitFor(p *Process, timeout time.Duration, what string, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if exited, perr := p.Exited(); exited {
			if strings.Contains(p.ownLogs(), "address already in use") {
				return errors.Wrapf(errPortTaken, "%s exited (%v) before %s; see %s", p.Name, perr, what, p.LogFile)
			}
			return errors.Errorf("%s exited (%v) before %s; see %s", p.Name, perr, what, p.LogFile)
		}
		if time.Now().After(deadline) {
			return errors.Wrapf(err, "%s: no %s after %s; see %s", p.Name, what, timeout, p.LogFile)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

func httpURL(port int) string { return fmt.Sprintf("http://%s", hostPort(port)) }

// LockedBuffer is a bytes.Buffer that several goroutines may write to.
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
