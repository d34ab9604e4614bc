package secret

import (
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// PoolEvents is the handler of the protector's watches of pools (and records).
func PoolEvents(p *Protector) handler.TypedEventHandler[client.Object, reconcile.Request] {
	return p.recordsChanged()
}
