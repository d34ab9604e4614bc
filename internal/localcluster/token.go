package localcluster

import (
	"context"

	"github.com/pkg/errors"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// ServiceAccountToken creates the ServiceAccount namespace/name, lets it get the
// non-resource URLs paths (a ClusterRole and ClusterRoleBinding of its name; no grant
// without paths), and returns an hour's token for it: how a scraper or an operator
// reads the manager's secure diagnostics endpoint.
func ServiceAccountToken(ctx context.Context, cfg *rest.Config, namespace, name string, paths ...string) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return "", errors.Wrapf(err, "creating the ServiceAccount %s/%s", namespace, name)
	}
	if len(paths) > 0 {
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{{NonResourceURLs: paths, Verbs: []string{"get"}}}}
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
			return "", errors.Wrapf(err, "creating the ClusterRole %s", name)
		}
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}}}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			return "", errors.Wrapf(err, "creating the ClusterRoleBinding %s", name)
		}
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		return "", errors.Wrapf(err, "a token for the ServiceAccount %s/%s", namespace, name)
	}
	return tr.Status.Token, nil
}
