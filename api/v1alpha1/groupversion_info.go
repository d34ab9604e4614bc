package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of the ipam.vitistack.io API.
	GroupVersion = schema.GroupVersion{Group: "ipam.vitistack.io", Version: "v1alpha1"}

	// SchemeBuilder adds the API's types to a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

const (
	// VitistackIPPoolKind is the kind of the namespaced pool.
	VitistackIPPoolKind = "VitistackIPPool"
	// GlobalVitistackIPPoolKind is the kind of the cluster-scoped pool.
	GlobalVitistackIPPoolKind = "GlobalVitistackIPPool"
)
