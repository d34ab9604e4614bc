package diagnostics

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// Options are the diagnostics and TLS flags, named and defaulted as Cluster API's.
type Options struct {
	// TLSMinVersion is --tls-min-version.
	TLSMinVersion string
	// TLSCipherSuites is --tls-cipher-suites.
	TLSCipherSuites []string
	// TLSCurvePreferences is --tls-curve-preferences.
	TLSCurvePreferences []int32
	// Address is --diagnostics-address.
	Address string
	// Insecure is --insecure-diagnostics.
	Insecure bool
}

// AddFlags registers the flags.
func AddFlags(fs *pflag.FlagSet, o *Options) {
	fs.StringVar(&o.TLSMinVersion, "tls-min-version", "VersionTLS12",
		"The minimum TLS version of the webhook server and of the diagnostics endpoint (unless --insecure-diagnostics). "+
			fmt.Sprintf("Possible values are %s.", strings.Join(cliflag.TLSPossibleVersions(), ", ")))
	fs.StringSliceVar(&o.TLSCipherSuites, "tls-cipher-suites", []string{},
		"Comma-separated cipher suites of the webhook server and of the diagnostics endpoint (unless --insecure-diagnostics); "+
			"Go's defaults if omitted. Preferred values: "+strings.Join(cliflag.PreferredTLSCipherNames(), ", ")+
			". Insecure values: "+strings.Join(cliflag.InsecureTLSCipherNames(), ", ")+".")
	fs.Int32SliceVar(&o.TLSCurvePreferences, "tls-curve-preferences", []int32{},
		"Comma-separated numeric Go crypto/tls CurveID values allowed for key exchange by the webhook server and the "+
			"diagnostics endpoint (unless --insecure-diagnostics); Go's defaults if omitted.")
	fs.StringVar(&o.Address, "diagnostics-address", ":8443",
		"The address the diagnostics endpoint binds to: /metrics, and /debug/pprof/ and /debug/flags/v (the log level) "+
			"unless --insecure-diagnostics. Served over https, every request authenticated (TokenReview) and authorized "+
			"(SubjectAccessReview for its path and verb) by the API server.")
	fs.BoolVar(&o.Insecure, "insecure-diagnostics", false,
		"Serve /metrics alone, over http, without authentication or authorization.")
}

// ManagerOptions turns the flags into the TLS options of the webhook server and the
// manager's metrics server options.
func ManagerOptions(o Options) ([]func(*tls.Config), *metricsserver.Options, error) {
	version, err := cliflag.TLSVersion(o.TLSMinVersion)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-min-version: %w (possible values: %s)", err, strings.Join(cliflag.TLSPossibleVersions(), ", "))
	}
	tlsOpts := []func(*tls.Config){func(c *tls.Config) { c.MinVersion = version }}
	if len(o.TLSCipherSuites) != 0 {
		suites, err := cliflag.TLSCipherSuites(o.TLSCipherSuites)
		if err != nil {
			return nil, nil, fmt.Errorf("--tls-cipher-suites: %w (see --help for the names)", err)
		}
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.CipherSuites = suites })
	}
	if len(o.TLSCurvePreferences) != 0 {
		curves, err := cliflag.TLSCurvePreferences(o.TLSCurvePreferences)
		if err != nil {
			return nil, nil, fmt.Errorf("--tls-curve-preferences: %w (Go crypto/tls CurveID numbers, such as 29 for X25519)", err)
		}
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.CurvePreferences = curves })
	}
	if o.Insecure {
		return tlsOpts, &metricsserver.Options{BindAddress: o.Address}, nil
	}
	return tlsOpts, &metricsserver.Options{
		BindAddress:    o.Address,
		SecureServing:  true,
		FilterProvider: WithAuthenticationAndAuthorization,
		ExtraHandlers: map[string]http.Handler{
			"/debug/flags/v":       logLevelHandler(logs.GlogSetter),
			"/debug/pprof/":        http.HandlerFunc(pprof.Index),
			"/debug/pprof/cmdline": http.HandlerFunc(pprof.Cmdline),
			"/debug/pprof/profile": http.HandlerFunc(pprof.Profile),
			"/debug/pprof/symbol":  http.HandlerFunc(pprof.Symbol),
			"/debug/pprof/trace":   http.HandlerFunc(pprof.Trace),
		},
		TLSOpts: tlsOpts,
	}, nil
}

// logLevelHandler sets the log verbosity from a PUT's body, as kube-apiserver's
// /debug/flags/v does: `curl -X PUT --data 4 .../debug/flags/v`.
func logLevelHandler(set func(string) (string, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPut {
			http.Error(w, "unsupported http method: PUT the level", http.StatusNotAcceptable)
			return
		}
		body, err := io.ReadAll(io.LimitReader(req.Body, 64))
		if err != nil {
			http.Error(w, "error reading request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		msg, err := set(strings.TrimSpace(string(body)))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, msg)
	}
}
