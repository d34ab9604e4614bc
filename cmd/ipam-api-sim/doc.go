// Command ipam-api-sim serves the stand-in vitistack IPAM-API (package pkg/ipamapi/sim) over HTTP, with flags for zones, latency, sweeping, a state file and an optional debug listener.
// It holds only flag parsing, listeners, persistence wiring and shutdown; the API behaviour itself lives in pkg/ipamapi/sim.
//
// Usage:
//
//	ipam-api-sim [--listen 127.0.0.1:3000] [--zones FILE] [--sweep-interval 30s]
//	             [--latency 0s] [--latency-jitter 0s] [--state-file FILE] [--debug-listen ADDR]
//	             [--prefix-load-delay 0s]
//
// --help lists the flags and the routes of the debug listener (sim.DebugRoutes); faults,
// the IPAM-API's failing backends included, are set there with PUT /faults.
//
// On start it logs "listening address=HOST:PORT" (and "debug listening address=..."),
// so --listen 127.0.0.1:0 can be used to pick a free port.
package main
