package e2e

import (
	"bufio"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/client-go/tools/clientcmd"
)

// The quickstart (`make quickstart` runs bin/quickstart) allocates the examples'
// addresses, prints them with a KUBECONFIG that works, and on Ctrl-C stops every
// process it started.
func TestQuickstart(t *testing.T) {
	g := newG(t)
	dir := filepath.Join(workDir, "quickstart")
	cmd := exec.Command(paths.Quickstart, "--dir", dir, "--templates", filepath.Join("..", "..", "templates"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Ctrl-C reaches it alone, as from a terminal
	stdout, err := cmd.StdoutPipe()
	g.Expect(err).NotTo(HaveOccurred())
	cmd.Stderr = cmd.Stdout
	g.Expect(cmd.Start()).To(Succeed())
	exited := make(chan struct{})
	t.Cleanup(func() { // if the test fails early: stop it as a user would, then for good
		select {
		case <-exited:
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
		}
	})

	// Read until it says it is ready (or ends).
	lines := make(chan string, 1000)
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		done <- cmd.Wait()
		close(exited)
	}()
	var out strings.Builder
	deadline := time.After(3 * time.Minute)
	for ready := false; !ready; {
		select {
		case l, ok := <-lines:
			g.Expect(ok).To(BeTrue(), "the quickstart ended early:\n%s", out.String())
			out.WriteString(l + "\n")
			ready = strings.Contains(l, "Press Ctrl-C to stop everything.")
		case <-deadline:
			t.Fatalf("the quickstart is not ready after 3 minutes:\n%s", out.String())
		}
	}
	text := out.String()
	t.Log(text)

	// Every example got an address of its zone.
	for _, want := range []string{
		`IPAddressClaim\s+default/example-any\s+10\.\S+\s+hnet-private`,
		`IPAddressClaim\s+default/example-fixed\s+10\.20\.30\.40\s+hnet-private`,
		`IPAddressClaim\s+default/example-ipv6\s+2a05:1234:\S*\s+inet`,
		`Service\s+default/example\s+10\.\S+\s+hnet-private`,
		`Service\s+default/example-anycast\s+83\.118\.\S+,2a05:1234:\S*\s+inet`,
	} {
		g.Expect(text).To(MatchRegexp(want))
	}

	// The KUBECONFIG it prints reaches the cluster.
	m := regexp.MustCompile(`export KUBECONFIG=(\S+)`).FindStringSubmatch(text)
	g.Expect(m).To(HaveLen(2))
	kc, err := clientcmd.LoadFromFile(m[1])
	g.Expect(err).NotTo(HaveOccurred())
	server := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster].Server
	kubectl := exec.Command("kubectl", "get", "ipaddresses.ipam.cluster.x-k8s.io", "-n", "default", "-o", "name")
	kubectl.Env = append(os.Environ(), "KUBECONFIG="+m[1])
	if _, err := exec.LookPath("kubectl"); err == nil {
		got, err := kubectl.CombinedOutput()
		g.Expect(err).NotTo(HaveOccurred(), string(got))
		g.Expect(string(got)).To(ContainSubstring("ipaddress.ipam.cluster.x-k8s.io/example-fixed"))
	}
	sim := regexp.MustCompile(`curl -s (http://\S+)/registrations`).FindStringSubmatch(text)
	g.Expect(sim).To(HaveLen(2))

	// Ctrl-C: it exits cleanly and nothing it started is left listening.
	g.Expect(cmd.Process.Signal(syscall.SIGINT)).To(Succeed())
	stopped := time.After(time.Minute)
	for open := true; open; {
		select {
		case l, ok := <-lines:
			if open = ok; ok {
				out.WriteString(l + "\n")
			}
		case <-stopped:
			t.Fatalf("the quickstart did not stop within a minute of Ctrl-C:\n%s", out.String())
		}
	}
	g.Expect(<-done).To(Succeed(), out.String())
	for _, u := range []string{server, sim[1]} {
		parsed, err := url.Parse(u)
		g.Expect(err).NotTo(HaveOccurred())
		conn, err := net.DialTimeout("tcp", parsed.Host, time.Second)
		if err == nil {
			_ = conn.Close()
		}
		g.Expect(err).To(HaveOccurred(), "%s still answers after Ctrl-C", u)
	}
}
