package diagnostics

import (
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/spf13/pflag"
)

// The flags are Cluster API's, with its defaults; the secure endpoint serves pprof and
// the log level behind the review filter, the insecure one /metrics alone.
func TestManagerOptions(t *testing.T) {
	g := NewWithT(t)
	parse := func(args ...string) Options {
		var o Options
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		AddFlags(fs, &o)
		g.Expect(fs.Parse(args)).To(Succeed())
		return o
	}

	tlsOpts, m, err := ManagerOptions(parse())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.BindAddress).To(Equal(":8443"))
	g.Expect(m.SecureServing).To(BeTrue())
	g.Expect(m.FilterProvider).NotTo(BeNil())
	g.Expect(m.ExtraHandlers).To(HaveKey("/debug/pprof/"))
	g.Expect(m.ExtraHandlers).To(HaveKey("/debug/flags/v"))
	var c tls.Config
	for _, o := range tlsOpts {
		o(&c)
	}
	g.Expect(c.MinVersion).To(Equal(uint16(tls.VersionTLS12)))

	tlsOpts, m, err = ManagerOptions(parse("--insecure-diagnostics", "--diagnostics-address=:8080",
		"--tls-min-version=VersionTLS13", "--tls-cipher-suites=TLS_AES_128_GCM_SHA256", "--tls-curve-preferences=29"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.BindAddress).To(Equal(":8080"))
	g.Expect(m.SecureServing).To(BeFalse())
	g.Expect(m.FilterProvider).To(BeNil())
	g.Expect(m.ExtraHandlers).To(BeEmpty(), "pprof and the log level are never served without authentication")
	c = tls.Config{}
	for _, o := range tlsOpts {
		o(&c)
	}
	g.Expect(c.MinVersion).To(Equal(uint16(tls.VersionTLS13)))
	g.Expect(c.CipherSuites).To(Equal([]uint16{tls.TLS_AES_128_GCM_SHA256}))
	g.Expect(c.CurvePreferences).To(Equal([]tls.CurveID{tls.X25519}))

	for flag, arg := range map[string]string{
		"--tls-min-version":       "--tls-min-version=TLS1.2",
		"--tls-cipher-suites":     "--tls-cipher-suites=TLS_NOT_A_SUITE",
		"--tls-curve-preferences": "--tls-curve-preferences=7",
	} {
		_, _, err := ManagerOptions(parse(arg))
		g.Expect(err).To(MatchError(HavePrefix(flag+": ")), arg)
	}
}

// PUT /debug/flags/v sets the log level, as kube-apiserver's endpoint does.
func TestLogLevelHandler(t *testing.T) {
	g := NewWithT(t)
	var level string
	h := logLevelHandler(func(v string) (string, error) {
		if strings.Trim(v, "0123456789") != "" || v == "" {
			return "", errors.New("invalid level " + v)
		}
		level = v
		return "successfully set klog.logging.verbosity to " + v, nil
	})
	do := func(method, body string) (int, string) {
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest(method, "/debug/flags/v", strings.NewReader(body)))
		return rec.Code, rec.Body.String()
	}
	code, body := do(http.MethodPut, "4\n")
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(body).To(Equal("successfully set klog.logging.verbosity to 4"))
	g.Expect(level).To(Equal("4"))
	code, _ = do(http.MethodGet, "")
	g.Expect(code).To(Equal(http.StatusNotAcceptable))
	code, body = do(http.MethodPut, "loud")
	g.Expect(code).To(Equal(http.StatusBadRequest))
	g.Expect(body).To(ContainSubstring("invalid level loud"))
	g.Expect(level).To(Equal("4"))
}
