package record

import (
	"strings"

	"github.com/pkg/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// DefaultSecretKey is the key of the value in every IPAM-API secret.
const DefaultSecretKey = "secret"

// SecretNameProblem says what is wrong with the Secret name an ipam.vitistack.io/secret
// annotation gives ("" when nothing is; keyword is the default secret's keyword, which
// is no Secret name).
func SecretNameProblem(name, keyword string) string {
	if name == keyword || len(validation.IsDNS1123Subdomain(name)) == 0 {
		return ""
	}
	hint := "name a Secret of the same namespace"
	if strings.EqualFold(name, keyword) {
		hint = "the keyword for the provider's default secret is \"" + keyword + "\", in lower case"
	}
	return "\"" + name + "\" is not a valid Secret name (lower-case letters, digits, '-' and '.'); " + hint
}

// ObjectRef names a key of a Secret, or of a ConfigMap or Secret holding a CA bundle.
type ObjectRef struct {
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Key       string `json:"key"`
}

// String is namespace/name/key, with "Kind:" in front for anything but a Secret.
func (r ObjectRef) String() string {
	if r.Name == "" {
		return ""
	}
	s := r.Namespace + "/" + r.Name + "/" + r.Key
	if r.Kind != "" && r.Kind != "Secret" {
		s = r.Kind + ":" + s
	}
	return s
}

// IsZero reports whether r names nothing.
func (r ObjectRef) IsZero() bool { return r.Name == "" }

// BundleKind is the kind of the object a CA bundle reference names: Secret, else ConfigMap
// (the default of spec.caBundleRef.kind).
func (r ObjectRef) BundleKind() string {
	if r.Kind == "Secret" {
		return "Secret"
	}
	return "ConfigMap"
}

// ObjectKey is the namespace and name of the object r points at.
func (r ObjectRef) ObjectKey() types.NamespacedName {
	return types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
}

// ParseObjectRef reads what String wrote; "" is the zero ObjectRef.
func ParseObjectRef(s string) (ObjectRef, error) {
	if s == "" {
		return ObjectRef{}, nil
	}
	r := ObjectRef{Kind: "Secret"}
	if kind, rest, ok := strings.Cut(s, ":"); ok && !strings.Contains(kind, "/") {
		if kind == "" {
			return ObjectRef{}, errors.Errorf("%q has an empty kind before the colon: write Kind:namespace/name/key or namespace/name/key", s)
		}
		r.Kind, s = kind, rest
	}
	parts := strings.Split(s, "/")
	// Kubernetes names and data keys never hold a colon; one would not read back.
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" || strings.Contains(s, ":") {
		return ObjectRef{}, errors.Errorf("%q is not namespace/name/key", s)
	}
	r.Namespace, r.Name, r.Key = parts[0], parts[1], parts[2]
	return r, nil
}

// Equal reports whether r and o name the same key of the same object (a Secret with
// or without its Kind spelled out is the same Secret).
func (r ObjectRef) Equal(o ObjectRef) bool { return r.String() == o.String() }
