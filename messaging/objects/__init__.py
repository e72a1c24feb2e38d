"""Object storage for closed segments: the store contract, its two implementations, the
names of segment objects, and what can go wrong.

* :mod:`~messaging.objects.store`: the :class:`ObjectStore` protocol and its values;
* :mod:`~messaging.objects.url`: ``--object-store URL`` to a store (:func:`parse_store_url`);
* :mod:`~messaging.objects.file`: ``file:///PATH`` (:class:`FileStore`);
* :mod:`~messaging.objects.s3`: ``s3://BUCKET/PREFIX`` over obstore (the ``s3`` extra; not
  imported here), configured by :mod:`~messaging.objects.s3_config`, its failures sorted by
  :mod:`~messaging.objects.s3_errors`;
* :mod:`~messaging.objects.naming`: Gazette-style object names of a segment and its time index;
* :mod:`~messaging.objects.checksum`, :mod:`~messaging.objects.verify`,
  :mod:`~messaging.objects.upload`: SHA-256 off the loop, verification by reading back, the
  steps of a conditional upload shared by every store;
* :mod:`~messaging.objects.errors`: the error kinds and their HTTP statuses.

This room imports only the shared ground (errors, files); the broker's rooms build on it.
"""

from messaging.objects.checksum import Digest
from messaging.objects.errors import (
    ObjectConflictError,
    ObjectCorruptError,
    ObjectNameError,
    ObjectNotFoundError,
    ObjectStoreError,
    StoreBucketMissingError,
    StoreDeniedError,
    StoreServerError,
    StoreUnavailableError,
    StoreUnreachableError,
)
from messaging.objects.file import FileStore
from messaging.objects.naming import SegmentObjectName, name_segment_object, parse_object_name
from messaging.objects.s3_config import S3Settings
from messaging.objects.store import ObjectInfo, ObjectStore, StoredObject
from messaging.objects.url import parse_store_url
from messaging.objects.verify import verify_object

__all__ = [
    "Digest",
    "FileStore",
    "ObjectConflictError",
    "ObjectCorruptError",
    "ObjectInfo",
    "ObjectNameError",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectStoreError",
    "S3Settings",
    "SegmentObjectName",
    "StoreBucketMissingError",
    "StoreDeniedError",
    "StoreServerError",
    "StoreUnavailableError",
    "StoreUnreachableError",
    "StoredObject",
    "name_segment_object",
    "parse_object_name",
    "parse_store_url",
    "verify_object",
]
