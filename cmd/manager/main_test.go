package main

import (
	"debug/elf"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
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
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v0.0.0-test", "-o", bin, ".")
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

	port := freePort(t)
	cmd := exec.Command(bin, "--enable-webhooks=false", "--ipam-api-url=http://127.0.0.1:3000",
		"--health-addr=127.0.0.1:"+strconv.Itoa(port), "--insecure-diagnostics", "--diagnostics-address=127.0.0.1:0",
		"--logging-format=json")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
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

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
