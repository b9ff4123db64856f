"""Objects behind NVIDIA's multi-storage-client as sources: `msc://profile/path`,
as megatron-core reads them. The profile (its store, bucket, endpoint and
credentials) comes from MSC's own configuration (MSC_CONFIG, ~/.msc_config.yaml);
the `storage:` block's endpoint and credentials do not apply, its cache and
prefetch keys do.

MSC asks again itself (the profile's `retry:` settings), so mmfs adds no attempts
of its own: `storage.retries` and `request_timeout` do not apply.

MSC's ranged read takes no ETag condition, so each fetch is followed by a look at
the object's ETag: a range read while the object was replaced is an error, never
a mix of old and new bytes. That costs a metadata request per fetch; a bucket
that s3:// reaches directly is read with half the requests.
"""

from __future__ import annotations

from mmfs.storage.base import NotThere, StorageUnavailable
from mmfs.storage.remote import Changed, Permanent, RemoteObject, Transient, register_backend, short
from mmfs.storage.settings import StorageSettings


def _msc():
    try:
        import multistorageclient
    except ImportError:
        raise StorageUnavailable("msc:// datasets need multi-storage-client: "
                                 "pip install 'mmfs[msc]'") from None
    return multistorageclient


class MscObject(RemoteObject):
    """One object of an MSC profile: looked up once, read by ranges."""

    asks_again = False

    def __init__(self, url: str, settings: StorageSettings) -> None:
        msc = _msc()
        try:  # the client is MSC's, cached per profile and remade after a fork
            self.client, self.path = msc.resolve_storage_client(url)
        except Exception as exc:  # an unknown profile, a config MSC cannot read
            raise StorageUnavailable(f"{url}: multi-storage-client cannot resolve it ({short(exc)}); "
                                     "check the profile in MSC_CONFIG or ~/.msc_config.yaml") from None
        super().__init__(url, settings)

    def _lookup(self) -> tuple[int, str]:
        try:
            meta = self.client.info(self.path)
        except FileNotFoundError:
            raise NotThere(f"{self.url}: no such object") from None
        except Exception as exc:  # denied, unreachable: MSC's providers raise their own kinds
            raise StorageUnavailable(f"{self.url}: multi-storage-client cannot look it up "
                                     f"({short(exc)}); check the profile's endpoint and "
                                     "credentials") from None
        return int(meta.content_length), str(meta.etag or "")

    def _get_into(self, offset: int, buffer: memoryview) -> None:
        msc = _msc()
        n = len(buffer)
        try:
            body = self.client.read(self.path, byte_range=msc.types.Range(offset=offset, size=n))
            etag = str(self.client.info(self.path).etag or "")
        except (FileNotFoundError, PermissionError, ValueError) as exc:
            raise Permanent(short(exc)) from None
        except Exception as exc:  # MSC has retried already; another round may still help
            raise Transient(short(exc)) from None
        if etag != self.etag:
            raise Changed()
        if len(body) != n:
            raise Transient(f"short body: {len(body)} of {n} bytes")
        buffer[:] = body


register_backend("msc", MscObject)
