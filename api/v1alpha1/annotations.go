package v1alpha1

// Prefix of every label and annotation of the provider.
const annotationPrefix = "ipam.vitistack.io/"

// Annotations users may set on IPAddressClaims (and Services), with the same keys and
// meanings as the vitistack IPAM-operator's Service annotations.
const (
	// AddressesAnnotation requests a specific address (bare IP or CIDR). On a Service it
	// lists one address per family, comma-separated.
	AddressesAnnotation = annotationPrefix + "addresses"
	// SecretAnnotation names an Opaque Secret (key "secret") in the claim's namespace
	// whose value owns the address; "default" means the provider's default secret.
	SecretAnnotation = annotationPrefix + "secret"
	// RetentionPeriodDaysAnnotation overrides the pool's retentionPeriodDays (0-30).
	RetentionPeriodDaysAnnotation = annotationPrefix + "retention-period-days"
	// DenyExternalCleanupAnnotation overrides the pool's denyExternalCleanup ("true"/"false").
	DenyExternalCleanupAnnotation = annotationPrefix + "deny-external-cleanup"
	// ServiceNameAnnotation overrides the service_name sent to the IPAM-API.
	ServiceNameAnnotation = annotationPrefix + "service-name"
	// NamespaceIDAnnotation overrides the namespace_id sent to the IPAM-API.
	NamespaceIDAnnotation = annotationPrefix + "namespace-id"
	// ClusterIDAnnotation overrides the cluster_id sent to the IPAM-API.
	ClusterIDAnnotation = annotationPrefix + "cluster-id"
	// ZoneAnnotation is the IPAM-API zone (on Services; recorded on IPAddresses as a label).
	ZoneAnnotation = annotationPrefix + "zone"
	// IPFamilyAnnotation is the family: ipv4, ipv6 or dual (on Services).
	IPFamilyAnnotation = annotationPrefix + "ip-family"
	// AllowLocalSharedIPAnnotation is the MetalLB sharing key (on Services).
	AllowLocalSharedIPAnnotation = annotationPrefix + "allow-local-shared-ip"
	// PoolAnnotation names the GlobalVitistackIPPool a Service's claims use.
	PoolAnnotation = annotationPrefix + "pool"
	// SupersededByAnnotation names, on a Service's claim, the claim of the same Service
	// that replaces it (the Service controller writes it when the Service moves to
	// another pool or address). A successor with the same IPAM-API identity takes the
	// registration over, and the superseded claim then goes without releasing it.
	SupersededByAnnotation = annotationPrefix + "superseded-by"

	// DefaultSecretName is the value of SecretAnnotation that means the default secret.
	DefaultSecretName = "default"
)

// ServiceFinalizer is put on Services of type LoadBalancer whose addresses the provider
// manages: their claims are deleted, and their addresses released, before they go.
const ServiceFinalizer = "ipam.vitistack.io/service"

// ServiceNameLabel on an IPAddressClaim names the Service it was made for.
const ServiceNameLabel = annotationPrefix + "service-name"

// SecretInUseFinalizer is put on every Secret whose value owns registered addresses, so
// that the Secret (and the namespace it is in) stays until those addresses are released.
const SecretInUseFinalizer = "ipam.vitistack.io/secret-in-use"

// SecretLettingGoAnnotation marks a Secret the Secret protector is letting go: nothing
// names it any more, and it looks once more, uncached, before it takes its finalizer and
// fingerprints off. A claim takes a marked Secret for unprotected, and registers nothing
// under it: either it reads the mark, or the protector's last look finds its record.
const SecretLettingGoAnnotation = annotationPrefix + "letting-go"

// CABundleInUseFinalizer is put on every ConfigMap or Secret that a registration names as
// the CA bundle of its IPAM-API, so that the bundle (and the namespace it is in) stays until
// the registration is released: a release needs it to reach the IPAM-API.
const CABundleInUseFinalizer = "ipam.vitistack.io/ca-bundle-in-use"

// Labels the provider writes on IPAddresses. With the Registered* annotations they are
// the registration record: zone and family are read back from these labels.
const (
	// ZoneLabel is the IPAM-API zone of the address.
	ZoneLabel = annotationPrefix + "zone"
	// IPFamilyLabel is the family of the address: ipv4 or ipv6.
	IPFamilyLabel = annotationPrefix + "ip-family"
	// PoolNameLabel is the name of the pool the address came from.
	PoolNameLabel = annotationPrefix + "pool-name"
	// PoolKindLabel is the kind of the pool the address came from.
	PoolKindLabel = annotationPrefix + "pool-kind"
)

// Annotations the provider writes on IPAddresses. They record the registration in the
// IPAM-API and are authoritative for every later call (re-register, rotate, release).
const (
	// RegisteredServiceNameAnnotation is the service_name the address is registered under.
	RegisteredServiceNameAnnotation = annotationPrefix + "registered-service-name"
	// RegisteredNamespaceIDAnnotation is the namespace_id the address is registered under.
	RegisteredNamespaceIDAnnotation = annotationPrefix + "registered-namespace-id"
	// RegisteredClusterIDAnnotation is the cluster_id the address is registered under.
	RegisteredClusterIDAnnotation = annotationPrefix + "registered-cluster-id"
	// RegisteredSecretRefAnnotation is the Secret (namespace/name/key) that owns the
	// address. The value of the Secret is never written anywhere.
	RegisteredSecretRefAnnotation = annotationPrefix + "registered-secret-ref"
	// RegisteredAddressAnnotation is the address exactly as the IPAM-API stores it (CIDR).
	RegisteredAddressAnnotation = annotationPrefix + "registered-address"
	// RegisteredEndpointAnnotation is the IPAM-API base URL the address is registered at.
	RegisteredEndpointAnnotation = annotationPrefix + "registered-endpoint"
	// RegisteredCABundleRefAnnotation is the CA bundle ([Kind:]namespace/name/key) that
	// signs the endpoint's certificate, if any.
	RegisteredCABundleRefAnnotation = annotationPrefix + "registered-ca-bundle-ref"
	// RegisteredRetentionPeriodDaysAnnotation is the retention sent with the registration
	// and with its release.
	RegisteredRetentionPeriodDaysAnnotation = annotationPrefix + "registered-retention-period-days"
	// RegisteredDenyExternalCleanupAnnotation is the deny_external_cleanup sent with it.
	RegisteredDenyExternalCleanupAnnotation = annotationPrefix + "registered-deny-external-cleanup"
	// RegisteredAttemptAnnotation is when the request whose answer the record shows was sent
	// (RFC 3339). A later attempt recorded on the claim has no answer on record: a bound claim's
	// re-registration or rotation after a crash or a lost answer, waited out before anything
	// else is sent for the identity or it is released.
	RegisteredAttemptAnnotation = annotationPrefix + "registered-attempt"

	// RegistrationAnnotation on a claim holds, as JSON, the claim's pending request to the
	// IPAM-API: what it is about to send (identity, zone, family, secret, requested or
	// candidate address, retention), its phase, and when its last request was sent,
	// written before every request (so a restart, or another claim of the identity, finds
	// what may still be carried out); and a rotation intent or a refused rotation. Once the
	// claim is bound, the IPAddress's labels and Registered* annotations are the
	// registration record; the claim's stays as it was last written. It lets a deleted
	// claim be released even if its IPAddress was never created.
	RegistrationAnnotation = annotationPrefix + "registration"
)

// SecretFingerprintsAnnotation on a Secret that a pool or a record names holds, by key,
// the fingerprint of the value (JSON), taken when a pool or record first named the key.
// Only readers of the Secret see it. A release or registration with a value whose
// fingerprint differs is refused: the value was changed in place.
const SecretFingerprintsAnnotation = annotationPrefix + "value-fingerprints"

// DescriptionAnnotation says, on the objects the provider creates for itself (the
// default secret and the list of protected Secrets), what they are for.
const DescriptionAnnotation = annotationPrefix + "description"

// SubnetProbeAnnotation on a subnet-mode pool holds, while the pool's subnet is checked
// against its zone, the address registered for the check (the subnet's first
// address), the identity it is registered under and when the request was sent, as
// JSON: written before the request, taken off once the address is released again, so a
// check cut short is finished by the next reconcile, once its request can no longer be
// carried out. The pool webhook refuses to delete a pool while it is there.
const SubnetProbeAnnotation = annotationPrefix + "subnet-probe"
