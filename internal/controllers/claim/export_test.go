package claim

import "sigs.k8s.io/controller-runtime/pkg/client"

// Observe tells the Reconciler what an IPAddress or claim names now (gone: it is
// deleted), as the cache's events do in a manager.
func (r *Reconciler) Observe(o client.Object, gone bool) { r.subnets.observe(o, gone) }
