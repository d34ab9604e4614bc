package secret

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
)

// LedgerName is the ConfigMap, in the default secret's namespace, that lists the
// Secrets the protector has protected.
const LedgerName = "vitistack-ipam-protected-secrets"

// ledgerKey is the ConfigMap's key: one "namespace/name" per line, sorted.
const ledgerKey = "secrets"

// Ledger is the list of the Secrets the protector has protected, kept in a ConfigMap so
// that every new leader looks at each of them again. Secrets are not watched and a
// record that goes is heard of only as an event: a leader that died in the second after
// the last record naming a Secret went would otherwise leave its finalizer on it for
// ever, as the next leader's informers never show what is no longer there. A Secret is
// listed before its finalizer is added and unlisted after it is removed, so a protected
// Secret is always listed. It costs two writes in a Secret's life, not one per claim.
type Ledger struct {
	// Client writes the ConfigMap.
	Client client.Client
	// Reader reads it, straight from the API server.
	Reader client.Reader
	// Key is the ConfigMap's namespace and name.
	Key types.NamespacedName
}

// List is the Secrets the ledger lists.
func (l *Ledger) List(ctx context.Context) ([]types.NamespacedName, error) {
	cm := &corev1.ConfigMap{}
	if err := l.Reader.Get(ctx, l.Key, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, errors.Wrapf(err, "reading the list of protected Secrets, ConfigMap %s", l.Key)
	}
	return Listed(cm), nil
}

// Listed is the Secrets a ledger's ConfigMap lists.
func Listed(cm *corev1.ConfigMap) []types.NamespacedName {
	var out []types.NamespacedName
	for _, line := range lines(cm) {
		if ns, name, ok := strings.Cut(line, "/"); ok {
			out = append(out, types.NamespacedName{Namespace: ns, Name: name})
		}
	}
	return out
}

// Set lists the Secret (listed) or takes it off the list, creating the ConfigMap on
// first use. A list that already says so is not written.
func (l *Ledger) Set(ctx context.Context, secret types.NamespacedName, listed bool) error {
	entry := secret.String()
	err := retry.RetryOnConflict(ledgerRetry, func() error {
		cm := &corev1.ConfigMap{}
		err := l.Reader.Get(ctx, l.Key, cm)
		if apierrors.IsNotFound(err) {
			if !listed {
				return nil
			}
			cm = &corev1.ConfigMap{}
			cm.Namespace, cm.Name = l.Key.Namespace, l.Key.Name
			cm.Labels = map[string]string{"app.kubernetes.io/managed-by": "cluster-api-ipam-provider-vitistack"}
			cm.Annotations = map[string]string{ipamv1alpha1.DescriptionAnnotation: "The Secrets and CA bundles the provider protects with its " +
				"secret-in-use and ca-bundle-in-use finalizers, so a new leader looks at each again. Maintained by the provider; do not edit."}
			cm.Data = map[string]string{ledgerKey: entry}
			err = l.Client.Create(ctx, cm)
			switch {
			case apierrors.IsAlreadyExists(err):
				return apierrors.NewConflict(corev1.Resource("configmaps"), l.Key.Name, err) // read it again
			case apierrors.IsNotFound(err):
				return errors.Errorf("its Namespace %s does not exist: create the Namespace (the provider's manifests ship it), "+
					"or point --default-secret-namespace at an existing one", l.Key.Namespace)
			}
			return err
		}
		if err != nil {
			return err
		}
		entries := lines(cm)
		i, found := slices.BinarySearch(entries, entry)
		switch {
		case found == listed:
			return nil
		case listed:
			entries = slices.Insert(entries, i, entry)
		default:
			entries = slices.Delete(entries, i, i+1)
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[ledgerKey] = strings.Join(entries, "\n")
		return l.Client.Update(ctx, cm) // with the version read: a conflict reads again
	})
	return errors.Wrapf(err, "updating the list of protected Secrets, ConfigMap %s", l.Key)
}

// ledgerRetry is how often a write that met another (the protector's other worker's) is
// tried again before the reconcile fails and is retried with back-off.
var ledgerRetry = wait.Backoff{Steps: 10, Duration: 10 * time.Millisecond, Factor: 1.5, Jitter: 1}

// lines is the ConfigMap's entries, sorted.
func lines(cm *corev1.ConfigMap) []string {
	var out []string
	for _, line := range strings.Split(cm.Data[ledgerKey], "\n") {
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// sweepRetry is how long a leader waits between tries to read the ledger.
const sweepRetry = 2 * time.Second

// Sweep is a source that enqueues every entry of the ledger that is the controller's (a
// Secret's, or, with caBundles, a CA bundle's) when the controller starts (once it leads),
// retrying until the list is read.
func (l *Ledger) Sweep(caBundles bool) source.Source {
	return source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		go func() {
			_ = wait.PollUntilContextCancel(ctx, sweepRetry, true, func(ctx context.Context) (bool, error) {
				entries, err := l.List(ctx)
				if err != nil {
					ctrl.Log.WithName("secret-protector").Error(err, "Looking at the protected Secrets and CA bundles again, retrying")
					return false, nil
				}
				for _, e := range entries {
					if IsCABundleEntry(e) == caBundles {
						q.Add(reconcile.Request{NamespacedName: e})
					}
				}
				return true, nil
			})
		}()
		return nil
	})
}

// IsCABundleEntry reports whether an entry of the ledger is a CA bundle's (the CA bundle
// protector's work item: namespace and "Kind/name"), not a Secret's.
func IsCABundleEntry(e types.NamespacedName) bool { return strings.Contains(e.Name, "/") }
