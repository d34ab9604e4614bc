// Command manager runs the vitistack Cluster API IPAM provider: flags, logging, the
// controller-runtime manager. The wiring itself lives in internal/manager.
package main
