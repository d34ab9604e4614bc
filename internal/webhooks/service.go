package webhooks

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Service validates the ipam.vitistack.io annotations of Services of type
// LoadBalancer. (Being written.)
type Service struct {
	// Client reads pools through the manager's cache.
	Client client.Reader
	// APIReader reads Secrets uncached.
	APIReader client.Reader
	// LoadBalancerClass, ExcludedNamespaces and DefaultZone are the Service
	// controller's settings: only the Services it serves are checked.
	LoadBalancerClass  string
	ExcludedNamespaces []string
	DefaultZone        string
}

var _ admission.CustomValidator = &Service{}

// SetupWithManager registers the webhook.
func (w *Service) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr).For(&corev1.Service{}).WithValidator(w).Complete()
}

// ValidateCreate implements admission.CustomValidator.
func (w *Service) ValidateCreate(context.Context, runtime.Object) (admission.Warnings, error) {
	return nil, nil
}

// ValidateUpdate implements admission.CustomValidator.
func (w *Service) ValidateUpdate(context.Context, runtime.Object, runtime.Object) (admission.Warnings, error) {
	return nil, nil
}

// ValidateDelete implements admission.CustomValidator.
func (w *Service) ValidateDelete(context.Context, runtime.Object) (admission.Warnings, error) {
	return nil, nil
}
