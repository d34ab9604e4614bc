// Package simulation is a seeded, deterministic simulation of every controller of the
// provider, in the spirit of FoundationDB's simulation testing and TigerBeetle's VOPR.
//
// The provider's own wiring (internal/manager.Setup) builds its controllers on a
// manager whose cache, clients, event delivery, work queues, clock and IPAM-API
// transport belong to the simulation. One goroutine runs at a time: a seeded scheduler
// decides which worker's next API call or IPAM-API call goes next, when each watch
// event reaches each process, which user action comes, which fault strikes (a conflict,
// a crash before or after a write lands, a lost, slow or late IPAM-API answer, a 5xx,
// NetBox down, a validation refusal on a retry), and when virtual time moves. After every
// quiet point the accounting oracle (test/chaos) must find nothing wrong; once faults
// stop, everything must settle within a bounded virtual time.
//
// A failure prints its seed and the trace of its last steps; the same seed replays the
// same run (SIM_SEED=n go test ./test/simulation -run Simulation -v). CI runs a fixed set
// of seeds; make test-chaos runs many more (SIM_SEEDS).
package simulation
