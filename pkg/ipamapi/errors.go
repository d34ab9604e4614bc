package ipamapi

import (
	"fmt"
	"strings"

	"github.com/pkg/errors"
)

// Class sorts IPAM-API failures by what a controller should do about them.
type Class string

const (
	// ClassValidation is a 400 that is the caller's fault: the request is not acceptable
	// (secret length, zone, family, address, retention) — or a request the client
	// refused to send for the same reasons. A user must change the pool, claim or
	// secret. A 400 "failed to fetch zones" (ClassBackendFailing) and a 400 "no
	// prefixes found" (ClassNoPrefixes) are not this class.
	ClassValidation Class = "Validation"
	// ClassNoPrefixes is the 400 "no prefixes found for zone <zone> with IP family
	// <family>": the IPAM-API knows the zone but has no container of that family. Either
	// the zone really has none (the user's fault, like ClassValidation) or the IPAM-API
	// restarted and has not loaded its zone containers yet (transient, gone within
	// seconds). The client cannot tell; the caller decides — treat it as transient
	// (retry with back-off) when the same zone and family worked before, else as a
	// validation error. It proves nothing about what is held (nothing was looked up).
	ClassNoPrefixes Class = "NoPrefixes"
	// ClassNotHeld is one of the two 404s of a release: the address is not held by this
	// secret and identity (already released or never registered). Release treats it as
	// success.
	ClassNotHeld Class = "NotHeld"
	// ClassWrongSecret is a 500 "no matching address found with the provided secret,
	// zone and address": the address is held under another secret (or was freed).
	ClassWrongSecret Class = "WrongSecret"
	// ClassNotInZone is a 500 "the requested address is not valid for the provided
	// zone": the requested address lies in no container of the zone.
	ClassNotInZone Class = "NotInZone"
	// ClassExhausted is a 500 "no available prefix found": the zone has no free address.
	ClassExhausted Class = "Exhausted"
	// ClassRotationRefused is a 500 "unable to change secret": the address is shared or
	// held by another service, so its secret cannot be rotated.
	ClassRotationRefused Class = "RotationRefused"
	// ClassBackendFailing means the IPAM-API's own backend (NetBox or MongoDB) is
	// failing: retry with back-off (IsTransient is true). It is never the caller's
	// fault and never proves anything about what is held — keep finalizers. Answers:
	// 400 "failed to fetch zones: ..." (NetBox), 500 with a MongoDB failure
	// ("failed to query address documents: ...", "failed to read address document: ...",
	// "failed to save address: ...", "server selection error" and the like), and any
	// 404 "Could not deregister service: ..." other than the two ClassNotHeld ones
	// (e.g. "...: failed to read address document: ..." while MongoDB is down).
	ClassBackendFailing Class = "BackendFailing"
	// ClassUnexpectedResponse is an answer that is not the IPAM-API's (for example the
	// HTML catch-all page that answers a wrong URL with 200, or a proxy's 404). The
	// endpoint is wrong.
	ClassUnexpectedResponse Class = "UnexpectedResponse"
	// ClassTransient is a connection error, a timeout or another 5xx: retry with back-off.
	ClassTransient Class = "Transient"
)

// Classes is every Class, in the order above: with "success", the values of the outcome
// label of the request metrics (Outcomes).
var Classes = []Class{ClassValidation, ClassNoPrefixes, ClassNotHeld, ClassWrongSecret, ClassNotInZone,
	ClassExhausted, ClassRotationRefused, ClassBackendFailing, ClassUnexpectedResponse, ClassTransient}

// Error is a failed IPAM-API call. Its text never contains a secret.
type Error struct {
	// Class says what to do about it.
	Class Class
	// Op is "register" or "release".
	Op string
	// StatusCode is the HTTP status, 0 when no answer was received.
	StatusCode int
	// Message is the server's message (or a description of the failure).
	Message string
	// Unknown is true when the request may have been carried out although no answer
	// arrived (a timeout or a connection lost after sending).
	Unknown bool
	// NotSent is true when the request was held back locally and never sent.
	NotSent bool
}

func (e *Error) Error() string {
	if e.StatusCode == 0 {
		return fmt.Sprintf("IPAM-API %s failed: %s", e.Op, e.Message)
	}
	return fmt.Sprintf("IPAM-API %s failed with HTTP %d: %s", e.Op, e.StatusCode, e.Message)
}

// ClassOf returns the class of an IPAM-API error anywhere in err's chain, or "" when err
// is not one.
func ClassOf(err error) Class {
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	return ""
}

// IsTransient reports whether err is worth retrying unchanged: ClassTransient and
// ClassBackendFailing. ClassNoPrefixes is not included: the caller decides (see ZoneGone).
func IsTransient(err error) bool {
	switch ClassOf(err) {
	case ClassTransient, ClassBackendFailing:
		return true
	}
	return false
}

// IsNotHeld reports whether a release found nothing to release.
func IsNotHeld(err error) bool { return ClassOf(err) == ClassNotHeld }

// IsExhausted reports whether the zone had no free address.
func IsExhausted(err error) bool { return ClassOf(err) == ClassExhausted }

// IsUnknownZone reports whether err is the 400 "invalid zone '<zone>', must be one of:
// …" (ClassValidation). The IPAM-API checks the zone against the zone list it reads from
// NetBox on each request.
func IsUnknownZone(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Class == ClassValidation && strings.HasPrefix(e.Message, msgInvalidZone)
}

// ZoneGone reports whether err says that the IPAM-API lacks the zone (IsUnknownZone) or the
// zone's prefixes of the family (ClassNoPrefixes), and, if so, says what it lacks and how
// that passes: for a zone and family that worked before, the answer is the IPAM-API's
// passing fault (its zone list, read from NetBox, lacked the zone; it loads its prefixes
// after a restart), and callers treat it as ClassBackendFailing; otherwise as the user's
// to fix. Both the claims and the pools' checks decide with it.
func ZoneGone(err error, zone string, family Family) (lacks, passes string, ok bool) {
	switch {
	case IsUnknownZone(err):
		return "did not know zone " + zone, "it reads its zones from NetBox", true
	case ClassOf(err) == ClassNoPrefixes:
		return fmt.Sprintf("has no prefixes for zone %s, family %s", zone, family), "it loads them after a restart", true
	}
	return "", "", false
}

// Server messages the classes are recognised by (byte-exact, misspellings included).
const (
	msgNotHeldNoMatch    = "no matching address found with the provivded secret, zone and address"
	msgNotHeldNoService  = "service does not exist for this address"
	msgNoMatchingAddress = "no matching address found with the provided secret, zone and address"
	msgNotValidForZone   = "the requested address is not valid for the provided zone"
	msgNoAvailablePrefix = "no available prefix found for zone"
	msgUnableToChange    = "unable to change secret"
	msgNoPrefixes        = "no prefixes found for zone "
	msgInvalidZone       = "invalid zone '"
	msgFetchZones        = "failed to fetch zones"
	msgDeregisterPrefix  = "Could not deregister service: "
	msgRegisterPrefix    = "Could not register address: "
)

// mongoFailures are the texts of the real server's MongoDB failures (its storage
// layer's wrappers and the driver's own), any of which in a 500 means the backend is
// failing.
var mongoFailures = []string{
	"failed to query address documents",
	"failed to read address document",
	"failed to decode address document",
	"failed to save address",
	"failed to update address",
	"failed to update services array",
	"server selection error",
}

func isMongoFailure(msg string) bool {
	for _, m := range mongoFailures {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// classify sorts a non-2xx answer.
func classify(op string, status int, msg string) *Error {
	e := &Error{Op: op, StatusCode: status, Message: msg, Class: ClassTransient}
	switch {
	case status == 400 && strings.HasPrefix(msg, msgFetchZones):
		// The zone list is read from NetBox before anything is validated.
		e.Class = ClassBackendFailing
	case status == 400 && strings.HasPrefix(msg, msgNoPrefixes):
		e.Class = ClassNoPrefixes
	case status == 400:
		e.Class = ClassValidation
	case status == 404 && (strings.Contains(msg, msgNotHeldNoMatch) || strings.Contains(msg, msgNotHeldNoService)):
		// Only the IPAM-API's own two 404s mean "not held": a 404 from a proxy or gateway
		// in front of it must not count as a release.
		e.Class = ClassNotHeld
	case status == 404 && (strings.HasPrefix(msg, msgDeregisterPrefix) || isMongoFailure(msg)):
		// The IPAM-API answers every failed release with 404; any reason but the two
		// above is its storage failing (MongoDB unreachable: "failed to read address
		// document: server selection error: ...").
		e.Class = ClassBackendFailing
	case status == 404:
		e.Class = ClassUnexpectedResponse
	case status == 500 && strings.Contains(msg, msgNoMatchingAddress):
		e.Class = ClassWrongSecret
	case status == 500 && strings.Contains(msg, msgNotValidForZone):
		e.Class = ClassNotInZone
	case status == 500 && strings.Contains(msg, msgNoAvailablePrefix):
		e.Class = ClassExhausted
	case status == 500 && strings.Contains(msg, msgUnableToChange):
		e.Class = ClassRotationRefused
	case status == 500 && (isMongoFailure(msg) || strings.HasPrefix(msg, msgRegisterPrefix)):
		// The IPAM-API answered: any other reason it could not register is its storage or
		// NetBox failing ("failed to save address: ...", NetBox's own text).
		e.Class = ClassBackendFailing
	case status >= 200 && status < 400:
		// Success without the IPAM-API's JSON, or a redirect: a wrong endpoint.
		e.Class = ClassUnexpectedResponse
	}
	return e
}
