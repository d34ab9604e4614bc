package registrar

import (
	"context"
	"encoding/json"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
)

// RedactSecret cuts the values and fingerprints of secs (a Secret as written, as it was, as it
// is now), also those in kubectl's last-applied-configuration, out of an error about writing
// it: an admission webhook may quote what it was sent, and the error reaches logs and the
// conditions and events of claims and pools whose readers may not read Secrets. An error with
// nothing to cut is returned as is, its type intact.
func RedactSecret(err error, secs ...*corev1.Secret) error {
	if err == nil {
		return nil
	}
	var values []string
	add := func(sec *corev1.Secret) {
		for _, v := range sec.Data {
			values = append(values, string(v), record.Fingerprint(v))
		}
		for _, v := range sec.StringData {
			values = append(values, v, record.Fingerprint([]byte(v)))
		}
		for _, fp := range record.Fingerprints(sec.Annotations) {
			values = append(values, fp)
		}
	}
	for _, sec := range secs {
		if sec == nil {
			continue
		}
		add(sec)
		applied := &corev1.Secret{}
		if json.Unmarshal([]byte(sec.Annotations[corev1.LastAppliedConfigAnnotation]), applied) == nil {
			add(applied)
		}
	}
	msg := err.Error()
	if cut := ipamapi.Redact(msg, values...); cut != msg {
		return redactedError(cut)
	}
	return err
}

// redactedError is an error's text with secrets cut out. It does not wrap the error
// it was made from, so nothing can get at the uncut text.
type redactedError string

func (e redactedError) Error() string { return string(e) }

// PatchSecret writes sec (read as before) with a merge patch locked to the version read.
// A refusal (an admission webhook's, say) may quote the Secret as it was sent, as it was,
// and as it is stored when the patch reaches the webhook (admission comes before the
// optimistic lock's check, so it may have changed since it was read): all their values
// are cut out of the error, which says what was being done. Conflicts and NotFound come
// back as they are.
func PatchSecret(ctx context.Context, w client.Writer, r client.Reader, sec, before *corev1.Secret, doing string) error {
	err := w.Patch(ctx, sec, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	if err == nil || apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return err
	}
	now := &corev1.Secret{}
	if r.Get(ctx, client.ObjectKeyFromObject(before), now) != nil {
		now = nil
	}
	return RedactSecret(errors.Wrapf(err, "%s Secret %s/%s", doing, before.Namespace, before.Name), sec, before, now)
}
