package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/manager"
)

// `make quickstart`, run as a user runs it, allocates the examples' addresses and
// prints them as README.md shows, with a KUBECONFIG that works; it serves both webhooks
// (a bad Service annotation is refused at admission); it restarts its manager after a
// kill -9, saying so, and the new one binds a new claim; stopped as a script stops it
// (SIGTERM to make, which passes it on) it stops every process it started.
func TestQuickstart(t *testing.T) {
	onOwn.enter(t)
	g := newG(t)
	ctx := context.Background()
	dir := filepath.Join(workDir, "quickstart")
	root, err := filepath.Abs(filepath.Join("..", ".."))
	g.Expect(err).NotTo(HaveOccurred())
	cmd := exec.Command("make", "--no-print-directory", "quickstart",
		"KUBE_VERSION="+filepath.Base(os.Getenv("KUBEBUILDER_ASSETS")), // the control plane this run tests, built already
		"QUICKSTART_FLAGS=--dir "+dir)
	cmd.Dir = root
	for _, e := range os.Environ() { // not a sub-make of the make that may run this test
		if k, _, _ := strings.Cut(e, "="); k != "MAKEFLAGS" && k != "MAKELEVEL" && k != "MFLAGS" {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its own process group, as a terminal gives it
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
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) // Ctrl-C, to the whole group
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})

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
	// upTo reads the quickstart's output until a line matches re, and returns that line.
	upTo := func(re string, within time.Duration) string {
		t.Helper()
		want := regexp.MustCompile(re)
		deadline := time.After(within)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the quickstart ended before printing %q:\n%s", re, out.String())
				}
				out.WriteString(l + "\n")
				if want.MatchString(l) {
					return l
				}
			case <-deadline:
				t.Fatalf("the quickstart did not print %q within %s:\n%s", re, within, out.String())
			}
		}
	}
	pid := regexp.MustCompile(`pid (\d+)`)
	first := pid.FindStringSubmatch(upTo(`^==> The manager runs \(pid \d+, log \S+\), restarted when it dies; both webhooks are served$`, 3*time.Minute))[1]
	upTo(`^Press Ctrl-C to stop everything\.$`, 3*time.Minute)
	text := out.String()
	t.Log(text)

	// Every example got an address of its zone, and its claim is Ready.
	for _, want := range []string{
		`default/example-any\s+True Allocated\s+10\.\S+\s+hnet-private\s+GlobalVitistackIPPool/hnet-private-ipv4`,
		`default/example-fixed\s+True Allocated\s+10\.20\.30\.40\s+hnet-private`,
		`default/example-ipv6\s+True Allocated\s+2a05:1234:\S*\s+inet`,
		`default/example\s+hnet-private\s+ipv4\s+10\.\S+`,
		`default/example-anycast\s+inet\s+dual\s+83\.118\.\S+,2a05:1234:\S*`,
		`GlobalVitistackIPPool/hnet-private-ipv4\s+hnet-private\s+IPv4\s+True Ready\s+3`,
	} {
		g.Expect(text).To(MatchRegexp(want))
	}
	// MetalLB announces, as each Service's external IP, exactly the addresses the
	// provider handed it.
	for _, svc := range []string{"default/example", "default/example-anycast"} {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(svc) + `\s+\S+\s+\S+\s+(\S+)\s+(\S+)\s`).FindStringSubmatch(text)
		g.Expect(m).To(HaveLen(3), "no row for %s", svc)
		g.Expect(m[2]).To(Equal(m[1]), "the external IP of %s", svc)
	}
	// README.md shows this output: the same lines, but for addresses, ages, paths and ports.
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	g.Expect(err).NotTo(HaveOccurred())
	shown := readmeBlock(t, string(readme), "<!-- quickstart-output")
	printed := text[strings.Index(text, "CLAIM "):]
	g.Expect(normalizeOutput(shown)).To(Equal(normalizeOutput(printed)),
		"README.md's Quickstart output differs from the quickstart's; paste this run's (from CLAIM to Press Ctrl-C):\n%s", printed)

	// The KUBECONFIG it prints reaches the cluster.
	m := regexp.MustCompile(`export KUBECONFIG=(\S+)`).FindStringSubmatch(text)
	g.Expect(m).To(HaveLen(2))
	kc, err := clientcmd.LoadFromFile(m[1])
	g.Expect(err).NotTo(HaveOccurred())
	server := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster].Server
	kubectl := exec.Command(paths.Kubectl, "get", "ipaddresses.ipam.cluster.x-k8s.io", "-n", "default",
		"-L", "ipam.vitistack.io/zone,ipam.vitistack.io/ip-family")
	kubectl.Env = append(os.Environ(), "KUBECONFIG="+m[1])
	got, err := kubectl.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), string(got))
	g.Expect(string(got)).To(MatchRegexp(`example-fixed\s+10\.20\.30\.40\s+hnet-private-ipv4\s+GlobalVitistackIPPool\s+\S+\s+hnet-private\s+ipv4`))
	sim := regexp.MustCompile(`curl -s (http://\S+)/registrations`).FindStringSubmatch(text)
	g.Expect(sim).To(HaveLen(2))
	cfg, err := clientcmd.BuildConfigFromFlags("", m[1])
	g.Expect(err).NotTo(HaveOccurred())
	c, err := client.New(cfg, client.Options{Scheme: manager.NewScheme()})
	g.Expect(err).NotTo(HaveOccurred())

	// Both webhooks are served: a bad Service annotation is refused at admission.
	bad := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bad", Annotations: map[string]string{ipamv1alpha1.ZoneAnnotation: "nowhere"}},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}},
	}
	err = c.Create(ctx, bad)
	g.Expect(err).To(HaveOccurred(), "the quickstart accepted a Service with an unknown zone")
	g.Expect(err.Error()).To(ContainSubstring(ipamv1alpha1.ZoneAnnotation))

	// kill -9 of the manager: the quickstart says so, restarts it, and it binds a new claim.
	n, err := strconv.Atoi(first)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(syscall.Kill(n, syscall.SIGKILL)).To(Succeed())
	upTo(`^==> The manager \(pid `+first+`\) died \(signal: killed\)\. The last lines of its log \S+:$`, time.Minute)
	second := pid.FindStringSubmatch(upTo(`^==> The manager runs again \(pid \d+, log \S+manager-2\.log\)$`, 2*time.Minute))[1]
	g.Expect(second).NotTo(Equal(first))
	after := &ipamv1.IPAddressClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "after-restart"},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{
			APIGroup: ipamv1alpha1.GroupVersion.Group, Kind: ipamv1alpha1.GlobalVitistackIPPoolKind, Name: "hnet-private-ipv4"}},
	}
	g.Expect(c.Create(ctx, after)).To(Succeed())
	g.Eventually(func(g Gomega) {
		got := &ipamv1.IPAddressClaim{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(after), got)).To(Succeed())
		g.Expect(got.Status.AddressRef.Name).NotTo(BeEmpty())
	}).Should(Succeed(), "the restarted manager did not bind a new claim")

	// SIGTERM to make alone, as a script stops it: it stops, and nothing it started is
	// left listening.
	g.Expect(cmd.Process.Signal(syscall.SIGTERM)).To(Succeed())
	stopped := time.After(time.Minute)
	for open := true; open; {
		select {
		case l, ok := <-lines:
			if open = ok; ok {
				out.WriteString(l + "\n")
			}
		case <-stopped:
			t.Fatalf("make quickstart did not stop within a minute of SIGTERM:\n%s", out.String())
		}
	}
	g.Expect(out.String()).To(ContainSubstring("==> Stopping"), "the quickstart itself was not told to stop")
	// make ends as the signal asks once its recipe has stopped; anything else is a failure.
	if err := <-done; err != nil {
		var exit *exec.ExitError
		g.Expect(errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGTERM).To(BeTrue(), "%v\n%s", err, out.String())
	}
	for _, u := range []string{server, sim[1]} {
		parsed, err := url.Parse(u)
		g.Expect(err).NotTo(HaveOccurred())
		conn, err := net.DialTimeout("tcp", parsed.Host, time.Second)
		if err == nil {
			_ = conn.Close()
		}
		g.Expect(err).To(HaveOccurred(), "%s still answers after Ctrl-C", u)
	}

	// The log a user opens when something looks wrong holds no error that recurs, and
	// kube-apiserver called nothing off this machine.
	apiLog, err := os.ReadFile(filepath.Join(dir, "quickstart", "kube-apiserver.log"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(callsOffMachine(string(apiLog))).To(BeEmpty())
	g.Expect(recurringErrors(string(apiLog), 3)).To(BeEmpty(), "kube-apiserver.log has recurring errors")
}

// recurringErrors returns the error lines of a klog log whose message (the line less
// its time, process and source) stands at least n times, each once with its count.
func recurringErrors(log string, n int) []string {
	counts := map[string]int{}
	var order []string
	for line := range strings.Lines(log) {
		if !strings.HasPrefix(line, "E") {
			continue
		}
		msg := strings.TrimSpace(line)
		if i := strings.Index(msg, "] "); i >= 0 {
			msg = msg[i+2:]
		}
		if counts[msg]++; counts[msg] == n {
			order = append(order, msg)
		}
	}
	out := make([]string, len(order))
	for i, m := range order {
		out[i] = fmt.Sprintf("%d× %.300s", counts[m], m)
	}
	return out
}

// readmeBlock returns the fenced code block that follows marker in a Markdown text.
func readmeBlock(t *testing.T, md, marker string) string {
	t.Helper()
	i := strings.Index(md, marker)
	if i < 0 {
		t.Fatalf("README.md has no %s", marker)
	}
	rest := md[i+len(marker):]
	open := strings.Index(rest, "```")
	if open < 0 {
		t.Fatalf("no code block after %s in README.md", marker)
	}
	rest = rest[open+3:]
	rest = rest[strings.Index(rest, "\n")+1:]
	end := strings.Index(rest, "```")
	if end < 0 {
		t.Fatalf("the code block after %s in README.md is not closed", marker)
	}
	return rest[:end]
}

var (
	ipv4Re  = regexp.MustCompile(`\b\d{1,3}(\.\d{1,3}){3}\b`)
	ipv6Re  = regexp.MustCompile(`\b[0-9a-f]{1,4}(:[0-9a-f]{0,4}){2,7}`)
	portRe  = regexp.MustCompile(`<ip>:\d+`)
	ageRe   = regexp.MustCompile(`\b\d+(\.\d+)?(ms|s|m|h|d)(\d+s)?\b`)
	pathRe  = regexp.MustCompile(`(^|[\s=])/\S+`)
	builtRe = regexp.MustCompile(`built in <t>, `)
	spaceRe = regexp.MustCompile(`[ \t]+`)
)

// normalizeOutput keeps what a README reader relies on (rows, columns, commands) and
// drops what differs from run to run: addresses, ages and durations, paths, ports, and
// the build time (make quickstart prints it, bin/quickstart alone does not).
func normalizeOutput(s string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		l = pathRe.ReplaceAllString(l, "${1}<path>")
		l = ipv4Re.ReplaceAllString(l, "<ip>")
		l = ipv6Re.ReplaceAllString(l, "<ip>")
		l = portRe.ReplaceAllString(l, "<ip>:<port>")
		l = ageRe.ReplaceAllString(l, "<t>")
		l = builtRe.ReplaceAllString(l, "")
		out = append(out, strings.TrimSpace(spaceRe.ReplaceAllString(l, " ")))
	}
	return strings.Join(out, "\n")
}
