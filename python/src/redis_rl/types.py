"""The redis-py clients the limiters take."""

from __future__ import annotations

from typing import Union

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

#: A synchronous client: ``redis.Redis`` or ``redis.cluster.RedisCluster``.
SyncClient = Union[redis.Redis, redis.cluster.RedisCluster]
#: An asyncio client: ``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster``.
AsyncClient = Union[redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster]
