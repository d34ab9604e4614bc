package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/pkg/errors"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ipam-api-sim:", err)
		stop()
		os.Exit(1)
	}
}

// usage prints the flags and the routes of the debug listener to the flag set's output.
func usage(fs *flag.FlagSet) {
	out := fs.Output()
	_, _ = fmt.Fprintf(out, "Usage of %s:\n", fs.Name())
	_, _ = fmt.Fprintln(out, "Serves a stand-in of the vitistack IPAM-API (POST /v2/address, DELETE /v2/service, POST and DELETE /).")
	_, _ = fmt.Fprintln(out)
	fs.PrintDefaults()
	_, _ = fmt.Fprintln(out)
	_, _ = fmt.Fprintln(out, "Routes of the debug listener (--debug-listen), JSON:")
	for _, rt := range sim.DebugRoutes() {
		_, _ = fmt.Fprintf(out, "  %-6s %-15s %s\n", rt.Method, rt.Path, rt.Doc)
	}
}

// run parses args, serves until ctx is done, then shuts down gracefully. Logs go to
// stdout as slog text lines.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ipam-api-sim", flag.ContinueOnError)
	fs.SetOutput(stdout)
	listen := fs.String("listen", "127.0.0.1:3000", "address of the IPAM-API listener (port 0 picks a free port)")
	zonesFile := fs.String("zones", "", "zone file (YAML or JSON: {\"zones\":[{\"name\":...,\"ipv4\":[...],\"ipv6\":[...]}]}); default: the production table")
	sweepInterval := fs.Duration("sweep-interval", sim.DefaultSweepInterval, "interval of the expiry sweeper")
	latency := fs.Duration("latency", 0, "injected latency per request (between lookup and commit)")
	jitter := fs.Duration("latency-jitter", 0, "random extra latency, uniform in [0, jitter]")
	stateFile := fs.String("state-file", "", "persist registrations (secret hashes only) to this JSON file")
	prefixLoadDelay := fs.Duration("prefix-load-delay", 0, "for this long after start (and after POST /reset on the debug listener) answer 400 \"no prefixes found for zone ...\" for every zone, like the real server while it loads its zone containers")
	debugListen := fs.String("debug-listen", "", "address of the inspection listener (routes below); off when empty")
	fs.Usage = func() { usage(fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // -h, --help: the usage was printed; not an error
		}
		return errors.Wrap(err, "parsing flags")
	}
	if fs.NArg() > 0 {
		return errors.Errorf("unexpected arguments: %v", fs.Args())
	}
	if *sweepInterval <= 0 {
		return errors.New("--sweep-interval must be positive")
	}
	if *prefixLoadDelay < 0 {
		return errors.New("--prefix-load-delay must not be negative")
	}

	logger := slog.New(slog.NewTextHandler(stdout, nil))
	cfg := sim.Config{
		SweepInterval: *sweepInterval,
		Latency:       *latency,
		LatencyJitter: *jitter,
		Logger:        logger,
		StateFile:     *stateFile,

		PrefixLoadDelay: *prefixLoadDelay,
	}
	if *zonesFile != "" {
		zones, err := sim.LoadZonesFile(*zonesFile)
		if err != nil {
			return err
		}
		cfg.Zones = zones
	}
	srv, err := sim.NewServer(cfg)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	var servers []*http.Server

	serve := func(name, addr string, h http.Handler) error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return errors.Wrapf(err, "%s listener", name)
		}
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, hs)
		logger.Info(name, "address", ln.Addr().String())
		go func() {
			if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- errors.Wrapf(err, "%s", name)
			}
		}()
		return nil
	}
	shutdown := func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		for _, hs := range servers {
			_ = hs.Shutdown(sctx)
		}
	}
	if err := serve("listening", *listen, srv); err != nil {
		return err
	}
	if *debugListen != "" {
		if err := serve("debug listening", *debugListen, srv.DebugHandler()); err != nil {
			shutdown()
			return err
		}
	}
	go func() { _ = srv.Run(ctx) }()

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	logger.Info("shutting down")
	cancel()
	shutdown()
	return runErr
}
