// Command compare benchmarks this provider against the Cluster API in-cluster IPAM
// provider (v1.1.0, built by the Makefile into bin/ipam-incluster) on this machine, in
// one run: `make bench-compare` (not part of `make test`).
//
// Every run gets a fresh control plane (etcd, kube-apiserver, kube-controller-manager
// from internal/localcluster) with the Cluster API IPAM CRDs and one provider, running
// as a process:
//
//   - vitistack: bin/manager (webhooks off) against bin/ipam-api-sim, with a
//     VitistackIPPool of zone hnet-private (IPv4, routed mode unless the run is in
//     subnet mode);
//   - in-cluster: bin/ipam-incluster (webhooks off) with an InClusterIPPool of
//     10.0.0.0/16.
//
// A run creates N IPAddressClaims from --workers goroutines and watches them (an
// informer) until every one has status.addressRef: claims/s is N over the time from the
// first create to the last bound claim, the latency of a claim is from its create's
// return to the watch seeing its addressRef. Meanwhile it counts the API server's
// requests (internal/apicount: writes per bound claim, without the harness's own
// creates, and uncached Secret GETs), the stand-in's requests, and the provider's
// memory (/proc VmHWM, VmRSS) and CPU time. Then nothing happens for --quiet (the
// writes and IPAM-API calls of an idle provider), then every claim is deleted and the
// time until all are gone is taken.
//
// Per repetition (--reps) and per N (--n), the two providers run one after the other;
// then the runs of this provider only: the stand-in at --extra-latencies and subnet
// mode at --extra-n claims, and both providers one claim at a time (--seq-n). At the
// end one run of this provider with --big-n claims shows its memory at that size. The
// report (stdout and --out) has the median of every figure over the repetitions, and
// the ratio to the in-cluster provider with the same N in the same repetition.
//
// A failed run is reported with the end of its processes' logs; the other runs go on,
// and the command exits non-zero.
package main
