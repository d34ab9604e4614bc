package controllers

import (
	"context"

	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
)

// ServiceReconciler gives Services of type LoadBalancer their addresses through
// IPAddressClaims. (Being written.)
type ServiceReconciler struct {
	Adapter            *ProviderAdapter
	Recorder           record.EventRecorder
	LoadBalancerClass  string
	ExcludedNamespaces []string
	DefaultZone        string
}

// SetupWithManager registers the controller.
func (r *ServiceReconciler) SetupWithManager(_ context.Context, _ ctrl.Manager) error { return nil }
