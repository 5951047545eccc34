"""What passes through Redis: the broker client, dispatch messages, pub/sub interrupts,
worker heartbeats and the latest GPU sample of every GPU. No NVML and no models here."""
