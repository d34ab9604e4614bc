package v1alpha1

// Conditions and reasons of the pool kinds.
const (
	// PoolReadyCondition is true when claims can be served from the pool: its secret
	// resolves and the IPAM-API accepts its zone and family.
	PoolReadyCondition = "Ready"

	// PoolReadyReason: the IPAM-API accepts the pool's zone and family with its secret.
	PoolReadyReason = "Ready"
	// PoolReadySecretNotFoundReason: the pool's Secret (or the key in it) does not exist.
	PoolReadySecretNotFoundReason = "SecretNotFound"
	// PoolReadySecretInvalidReason: the Secret's value is not 8 to 64 characters long.
	PoolReadySecretInvalidReason = "SecretInvalid"
	// PoolReadyCABundleNotFoundReason: the pool's CA bundle could not be read or parsed.
	PoolReadyCABundleNotFoundReason = "CABundleNotFound"
	// PoolReadyZoneRejectedReason: the IPAM-API refused the zone or family (HTTP 400).
	PoolReadyZoneRejectedReason = "ZoneRejected"
	// PoolReadyIPAMAPIUnreachableReason: the IPAM-API could not be reached or answered
	// with something other than its API (for example an HTML page).
	PoolReadyIPAMAPIUnreachableReason = "IPAMAPIUnreachable"
	// PoolReadyDeletingReason: the pool is being deleted.
	PoolReadyDeletingReason = "Deleting"
	// PoolReadySubnetOutsideZoneReason: the IPAM-API refused an address of the pool's
	// subnet as not belonging to the pool's zone.
	PoolReadySubnetOutsideZoneReason = "SubnetOutsideZone"
	// PoolReadyBackendFailingReason: the IPAM-API answers, but its own backend (NetBox
	// or MongoDB) is failing.
	PoolReadyBackendFailingReason = "IPAMAPIBackendFailing"

	// PoolExhaustedCondition is true when every usable address of a subnet-mode pool is
	// bound to a claim; claims wait until one frees up.
	PoolExhaustedCondition = "Exhausted"
	// PoolExhaustedReason: every usable address of the subnet is bound (addresses held in
	// the IPAM-API by others are skipped by claims, not counted here).
	PoolExhaustedReason = "NoFreeAddress"
	// PoolNotExhaustedReason: addresses are left.
	PoolNotExhaustedReason = "AddressesLeft"
)

// Reasons used on IPAddressClaims beside the CAPI ones (AllocationFailed, PoolNotReady,
// PoolExhausted), for the Ready condition: each names its problem, as kubectl, alerts and
// the Service that repeats it see it; AllocationFailed is left for what has no name.
const (
	// ClaimReadyAllocatedReason: the claim has an address.
	ClaimReadyAllocatedReason = "Allocated"
	// ClaimReadySecretNotFoundReason: the Secret that owns the address does not exist.
	ClaimReadySecretNotFoundReason = "SecretNotFound"
	// ClaimReadySecretInvalidReason: the Secret's value is not 8 to 64 characters long,
	// as the IPAM-API requires (as for pools).
	ClaimReadySecretInvalidReason = "SecretInvalid"
	// ClaimReadyInvalidAnnotationReason: an ipam.vitistack.io annotation on the claim
	// has a value that cannot be used.
	ClaimReadyInvalidAnnotationReason = "InvalidAnnotation"
	// ClaimReadySecretDeletingReason: the Secret that would own the address is being
	// deleted; nothing new is registered under it.
	ClaimReadySecretDeletingReason = "SecretDeleting"
	// ClaimReadyAddressNotInZoneReason: the requested address does not belong to the
	// pool's zone.
	ClaimReadyAddressNotInZoneReason = "AddressNotInZone"
	// ClaimReadyAddressTakenReason: the requested address (or, in subnet mode, the one a
	// claim that lost its IPAddress was bound to) is held under another secret.
	ClaimReadyAddressTakenReason = "AddressTaken"
	// ClaimReadyIPAMAPIUnreachableReason: the IPAM-API could not be reached; the claim
	// is retried with back-off.
	ClaimReadyIPAMAPIUnreachableReason = "IPAMAPIUnreachable"
	// ClaimReadyReleaseFailedReason: releasing the address failed; retried with back-off.
	ClaimReadyReleaseFailedReason = "ReleaseFailed"
	// ClaimReadyAddressInUseReason: the requested address is bound to another claim, and
	// the two do not both declare the same share key.
	ClaimReadyAddressInUseReason = "AddressInUse"
	// ClaimReadyIdentityInUseReason: another claim holds the same IPAM-API identity.
	ClaimReadyIdentityInUseReason = "IdentityInUse"
	// ClaimReadyIdentityOverrideNotAllowedReason: the claim overrides its IPAM-API
	// identity, and its pool does not allow that (spec.allowIdentityOverrides).
	ClaimReadyIdentityOverrideNotAllowedReason = "IdentityOverrideNotAllowed"
	// ClaimReadySubnetOutsideZoneReason: the IPAM-API says an address of the pool's
	// subnet is not in the pool's zone; the pool is not Ready either.
	ClaimReadySubnetOutsideZoneReason = "SubnetOutsideZone"
	// ClaimReadyBackendFailingReason: the IPAM-API answered, but its own backend
	// (NetBox or MongoDB) is failing; retried with back-off.
	ClaimReadyBackendFailingReason = "IPAMAPIBackendFailing"
	// ClaimReadySecretValueChangedReason: the value of the Secret that owns the address
	// changed after the address was registered under it.
	ClaimReadySecretValueChangedReason = "SecretValueChanged"
	// ClaimReadySecretNotProtectedReason: the claim has waited a while for the Secret
	// protector to protect its Secret (finalizer and fingerprint), which comes before
	// anything is registered under it; the message has the protector's last error.
	ClaimReadySecretNotProtectedReason = "SecretNotProtected"
)

// The AddressShared condition of an IPAddressClaim: True while its address is bound to
// other claims too.
const (
	// ClaimAddressSharedCondition is True while the address is shared.
	ClaimAddressSharedCondition = "AddressShared"
	// ClaimAddressSharedReason: the address is shared by consent (every other claim
	// declares the same share key).
	ClaimAddressSharedReason = "SharedByConsent"
	// ClaimAddressSharedWithoutConsentReason: another claim is bound to the address
	// without the same share key (an earlier version of the provider let that happen);
	// one of them must request another address.
	ClaimAddressSharedWithoutConsentReason = "SharedWithoutConsent"
)

// The SecretRotated condition of an IPAddressClaim: whether the secret that owns its
// address in the IPAM-API is the one its annotations (or pool) name now.
const (
	// ClaimSecretRotatedCondition is True after a rotation, False when one was refused.
	ClaimSecretRotatedCondition = "SecretRotated"
	// ClaimSecretRotatedReason: the IPAM-API accepted the new secret.
	ClaimSecretRotatedReason = "Rotated"
	// ClaimSecretRotationRefusedReason: the IPAM-API refused (the address is shared by
	// several services, or held by another); the address keeps the old secret.
	ClaimSecretRotationRefusedReason = "RotationRefused"
)

// Reasons of events that are not a condition's reason.
const (
	// EventNoPoolReason: no GlobalVitistackIPPool serves a Service's zone and family.
	EventNoPoolReason = "NoPool"
	// EventMetalLBAssignedReason: MetalLB announces, for a Service, an address the
	// provider has not handed it: a MetalLB pool with autoAssign on picked it.
	EventMetalLBAssignedReason = "MetalLBAssigned"
	// EventMetalLBRefusedReason: MetalLB refuses, for a Service, the addresses the
	// provider handed it (its AllocationFailed event names them): no MetalLB pool covers
	// them, say, and MetalLB announces nothing for the Service.
	EventMetalLBRefusedReason = "MetalLBRefused"
	// EventReleasedReason: a claim's address was released with a retention that keeps
	// it for the claim's identity.
	EventReleasedReason = "Released"
	// EventSecretRotatedReason: the IPAM-API accepted a claim's new secret (the
	// SecretRotated condition's reason is Rotated).
	EventSecretRotatedReason = "SecretRotated"
	// EventAnnotationIgnoredReason: a bound claim's annotations ask for another address or
	// IPAM-API identity, which a bound claim never takes.
	EventAnnotationIgnoredReason = "AnnotationIgnored"
	// EventAddressReturnedReason: a claim that asked for any address was given one its
	// IPAM-API identity held already (a retained address, or a lost answer's).
	EventAddressReturnedReason = "AddressReturned"
)
