// Package v1alpha1 holds the ipam.vitistack.io/v1alpha1 API: the VitistackIPPool and
// GlobalVitistackIPPool kinds, their CEL validation, and the condition, reason, label and
// annotation constants users see. It holds types only: no controller or client code.
//
// +kubebuilder:object:generate=true
// +groupName=ipam.vitistack.io
package v1alpha1
