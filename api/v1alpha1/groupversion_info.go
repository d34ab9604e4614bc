package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of the ipam.vitistack.io API.
	GroupVersion = schema.GroupVersion{Group: "ipam.vitistack.io", Version: "v1alpha1"}

	// schemeBuilder adds the API's types to a scheme, as Cluster API's API packages do
	// (with apimachinery alone: API packages stay light to import).
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the API's types to a scheme.
	AddToScheme = schemeBuilder.AddToScheme

	// objectTypes are the API's kinds, registered by the files that define them.
	objectTypes = []runtime.Object{}
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, objectTypes...)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}

const (
	// VitistackIPPoolKind is the kind of the namespaced pool.
	VitistackIPPoolKind = "VitistackIPPool"
	// GlobalVitistackIPPoolKind is the kind of the cluster-scoped pool.
	GlobalVitistackIPPoolKind = "GlobalVitistackIPPool"
)
