package main

import (
	"crypto/tls"
	"debug/elf"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
)

// The binary the Dockerfile packages is static (no dynamic loader, no shared
// libraries, as distroless/static needs) and starts against a real API server.
func TestBinaryIsStaticAndStarts(t *testing.T) {
	g := NewWithT(t)
	bin := filepath.Join(t.TempDir(), "manager")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X main.version=v0.0.0-test", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), string(out))

	f, err := elf.Open(bin)
	g.Expect(err).NotTo(HaveOccurred())
	for _, p := range f.Progs {
		g.Expect(p.Type).NotTo(Equal(elf.PT_INTERP), "the binary needs a dynamic loader")
	}
	libs, _ := f.ImportedLibraries()
	g.Expect(libs).To(BeEmpty())
	_ = f.Close()

	out, err = exec.Command(bin, "--version").Output()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(out)).To(Equal("v0.0.0-test\n"))

	// Against a real API server: it becomes ready, and stops cleanly on SIGTERM.
	ctrl.SetLogger(logr.Discard())
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets(t),
		CRDInstallOptions: envtest.CRDInstallOptions{Paths: []string{
			filepath.Join(testenv.RepoRoot(), "config", "crd", "bases"),
			filepath.Join(testenv.RepoRoot(), "config", "services", "capi-crds"),
		}, ErrorIfPathMissing: true},
	}
	cfg, err := env.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = env.Stop() })
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	g.Expect(clientcmd.WriteToFile(*localcluster.KubeconfigFor(cfg, "test"), kubeconfig)).To(Succeed())

	ports, err := localcluster.FreePorts(2)
	g.Expect(err).NotTo(HaveOccurred())
	port, diagPort := ports[0], ports[1]
	// The diagnostics endpoint as shipped: https, every request reviewed by the API
	// server. --v=5 logs every refusal, so that the check below that no token is logged
	// can fail.
	cmd := exec.Command(bin, "--enable-webhooks=false", "--ipam-api-url=http://127.0.0.1:3000",
		"--health-addr=127.0.0.1:"+strconv.Itoa(port), "--diagnostics-address=127.0.0.1:"+strconv.Itoa(diagPort),
		"--logging-format=json", "--v=5")
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOGC=") }), "KUBECONFIG="+kubeconfig)
	logs := &testenv.Logs{}
	cmd.Stdout, cmd.Stderr = logs, logs
	g.Expect(cmd.Start()).To(Succeed())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	g.Eventually(func() int {
		res, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/readyz")
		if err != nil {
			return 0
		}
		_ = res.Body.Close()
		return res.StatusCode
	}, time.Minute, 200*time.Millisecond).Should(Equal(http.StatusOK), "logs: %s", logs)
	g.Expect(logs.String()).To(ContainSubstring(`"msg":"Starting manager"`))

	diagnosticsAreReviewed(t, cfg, "https://127.0.0.1:"+strconv.Itoa(diagPort), logs)

	g.Expect(cmd.Process.Signal(syscall.SIGTERM)).To(Succeed())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	g.Eventually(done, 30*time.Second).Should(Receive(BeNil()), "logs: %s", logs)
}

func assets(t *testing.T) string {
	for _, dir := range []string{os.Getenv("KUBEBUILDER_ASSETS"), filepath.Join(testenv.RepoRoot(), "bin")} {
		if _, err := os.Stat(filepath.Join(dir, "kube-apiserver")); dir != "" && err == nil {
			return dir
		}
	}
	t.Fatal("kube-apiserver not found: run 'make test-assets'")
	return ""
}

// diagnosticsAreReviewed checks the secure diagnostics endpoint at url as a scraper
// meets it: no token, or one the API server does not know, is 401; a ServiceAccount
// without RBAC for the path is 403; one allowed `get` on /metrics reads the metrics
// and nothing else. No token appears in the manager's log.
func diagnosticsAreReviewed(t *testing.T, cfg *rest.Config, url string, logs *testenv.Logs) {
	g := NewWithT(t)
	ctx := t.Context()
	stranger, err := localcluster.ServiceAccountToken(ctx, cfg, "default", "stranger")
	g.Expect(err).NotTo(HaveOccurred())
	scraper, err := localcluster.ServiceAccountToken(ctx, cfg, "default", "scraper", "/metrics")
	g.Expect(err).NotTo(HaveOccurred())

	// The endpoint's certificate is self-signed, made at the manager's start.
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	try := func(path, token string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+path, http.NoBody)
		g.Expect(err).NotTo(HaveOccurred())
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		return hc.Do(req)
	}
	// /readyz answers before every runnable has started: wait for the endpoint to listen.
	g.Eventually(func() error {
		res, err := try("/metrics", "")
		if err == nil {
			_ = res.Body.Close()
		}
		return err
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed(), "logs: %s", logs)
	get := func(path, token string) (int, string) {
		res, err := try(path, token)
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = res.Body.Close() }()
		body, err := io.ReadAll(res.Body)
		g.Expect(err).NotTo(HaveOccurred())
		return res.StatusCode, string(body)
	}
	code, _ := get("/metrics", "")
	g.Expect(code).To(Equal(http.StatusUnauthorized), "no token")
	code, _ = get("/metrics", "not-a-token")
	g.Expect(code).To(Equal(http.StatusUnauthorized), "a token the API server does not know")
	code, body := get("/metrics", stranger)
	g.Expect(code).To(Equal(http.StatusForbidden), "a ServiceAccount without RBAC for /metrics")
	g.Expect(body).To(ContainSubstring("Authorization denied for user system:serviceaccount:default:stranger"))
	code, body = get("/metrics", scraper)
	g.Expect(code).To(Equal(http.StatusOK), "the scraper: %s", body)
	g.Expect(body).To(ContainSubstring(`capi_reconcile_total{controller="VitistackIPPool"`), "the provider's metrics")
	g.Expect(body).To(MatchRegexp(`(?m)^go_gc_gogc_percent 50$`), "the manager's GC percent without GOGC")
	// client-go's work queue (its depth has no priority), not controller-runtime v0.24's
	// priority queue, which can keep the manager from stopping (see ControllerConfig).
	// A queue's metrics come when its controller starts, which can be after /readyz.
	g.Eventually(func(g Gomega) {
		_, body := get("/metrics", scraper)
		for _, c := range []string{"ipaddressclaim", "VitistackIPPool", "GlobalVitistackIPPool", "secret-protector"} {
			g.Expect(body).To(ContainSubstring(`workqueue_depth{controller="%s",name="%s",priority=""}`, c, c), "the %s controller's queue", c)
		}
	}, 30*time.Second, 200*time.Millisecond).Should(Succeed())
	code, _ = get("/debug/pprof/", scraper)
	g.Expect(code).To(Equal(http.StatusForbidden), "the scraper may read /metrics only")

	g.Expect(logs.String()).To(ContainSubstring("Authorization denied"), "--v=5 logs refusals")
	for _, tok := range []string{stranger, scraper, "not-a-token"} {
		g.Expect(logs.String()).NotTo(ContainSubstring(tok))
	}
}
