package claim

import (
	"context"
	"time"

	"github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/note"
)

// The actions of the claim controller's events (events.k8s.io/v1 requires one).
const (
	actionAllocate = "Allocate"
	actionRotate   = "RotateSecret"
	actionRelease  = "Release"
)

// outcome is what one reconcile of a claim came to. report turns it into the claim's
// conditions, its events and the error the Reconciler gets: the one place that does.
type outcome struct {
	// ready is the Ready condition's status; "" leaves the condition as it is.
	ready   metav1.ConditionStatus
	reason  string
	message string
	action  string
	// set and drop are other conditions to set or remove (SecretRotated, AddressShared).
	set  []metav1.Condition
	drop []string
	// notes are events that go out whatever the conditions do (Released, SecretRotated).
	notes []eventNote
	// err is returned to the Reconciler; with ready False and no err, the message is.
	err error
	// terminal waits for the claim's or pool's watch, or the Secret protector, not back-off.
	terminal bool
	// retry brings the claim back after this long, without back-off or error: a known wait.
	retry time.Duration
}

type eventNote struct{ typ, reason, action, message string }

func allocated(address string) outcome {
	return outcome{ready: metav1.ConditionTrue, reason: ipamv1alpha1.ClaimReadyAllocatedReason, message: "Allocated " + address, action: actionAllocate}
}

// failed is a Ready=False outcome; retried with back-off unless made terminal.
func failed(reason, message string) outcome {
	return outcome{ready: metav1.ConditionFalse, reason: reason, message: message, action: actionAllocate}
}

// transient is a failure retried with back-off, leaving the conditions (a bound claim stays Ready).
func transient(err error) outcome { return outcome{err: err} }

// stop is an outcome that ends the step it came from (nil: the step goes on).
func stop(o outcome) *outcome { return &o }

func (o outcome) final() outcome                  { o.terminal = true; return o }
func (o outcome) retryIn(d time.Duration) outcome { o.retry = max(d, time.Millisecond); return o }
func (o outcome) releasing() outcome              { o.action = actionRelease; return o }

func (o outcome) note(typ, reason, action, message string) outcome {
	o.notes = append(o.notes, eventNote{typ, reason, action, message})
	return o
}

// report applies an outcome to the claim (patched when the reconcile ends) and returns the
// reconcile's result: a known wait comes back when it ends, without back-off.
func (h *Handler) report(ctx context.Context, o outcome) (ctrl.Result, error) {
	if o.ready == metav1.ConditionTrue && h.creating {
		// Not before the addressRef: Cluster API's patch helper writes the conditions first,
		// and a user who waits for Ready reads the addressRef next. The next reconcile says it.
		o.ready = ""
	}
	if o.ready != "" {
		o.message = note.Truncate(o.message, note.ConditionLimit)
		// One event per change of the condition, never per retry or resync; none on the
		// first binding, one on recovery. prev points into the conditions: read it first.
		prev := conditions.Get(h.claim, ipamv1.IPAddressClaimReadyCondition)
		changed := prev == nil || prev.Status != o.ready || prev.Reason != o.reason || prev.Message != o.message
		recovered := prev != nil && prev.Status != metav1.ConditionTrue
		conditions.Set(h.claim, metav1.Condition{Type: ipamv1.IPAddressClaimReadyCondition, Status: o.ready, Reason: o.reason, Message: o.message})
		if changed && (o.ready != metav1.ConditionTrue || recovered) {
			typ, reason := corev1.EventTypeWarning, o.reason
			if o.ready == metav1.ConditionTrue {
				typ = corev1.EventTypeNormal
			}
			h.Recorder.Eventf(h.claim, nil, typ, reason, o.action, "%s", o.message)
		}
	}
	for _, c := range o.set {
		conditions.Set(h.claim, c)
	}
	for _, t := range o.drop {
		conditions.Delete(h.claim, t)
	}
	for _, n := range o.notes {
		h.Recorder.Eventf(h.claim, nil, n.typ, n.reason, n.action, "%s", n.message)
	}
	err := o.err
	if err == nil && o.ready == metav1.ConditionFalse {
		err = errors.New(o.message)
	}
	switch {
	case err == nil:
		return ctrl.Result{}, nil
	case o.retry > 0 && h.creating:
		// ipamutil's loop would create the IPAddress for a result without an error.
		return ctrl.Result{}, h.waiting(o.retry, err)
	case o.retry > 0:
		ctrl.LoggerFrom(ctx).V(1).Info("Waiting", "reason", err.Error())
		return ctrl.Result{RequeueAfter: o.retry}, nil
	case o.terminal:
		err = reconcile.TerminalError(err)
	}
	return ctrl.Result{}, err
}
