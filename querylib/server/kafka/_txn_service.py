"""Request handlers of the transaction apis: AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and
TxnOffsetCommit (InitProducerId is `_handlers`', FindCoordinator `_group_service`'s). Each
takes kio's decoded request and answers through the backend's `TransactionCoordinator`
(`_txn`); a `TqError` becomes its Kafka error code. No sockets, no state of their own.
"""

from __future__ import annotations

from typing import Any

from catalog.errors import TqError
from querylib.kafka._apis import ApiKey, build_response
from querylib.kafka._errors import ErrorCode, error_code_of

from ._backend import CommittedOffset, KafkaBackend
from ._handlers import RequestContext

__all__ = ["TxnHandlers"]


class TxnHandlers:
    def __init__(self, backend: KafkaBackend) -> None:
        self.backend = backend

    async def _refusal(self, transactional_id: str) -> ErrorCode | None:
        try:
            if not await self.backend.coordinates(transactional_id):
                return ErrorCode.not_coordinator
        except TqError as exc:
            return error_code_of(exc)
        return None

    async def add_partitions_to_txn(self, ctx: RequestContext, request: Any) -> Any:
        txn_id = request.v3_and_below_transactional_id
        code = await self._refusal(txn_id)
        if code is None:
            wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
            try:
                await self.backend.transactions.add_partitions(
                    txn_id, request.v3_and_below_producer_id,
                    request.v3_and_below_producer_epoch, wanted, ctx.principal)
                code = ErrorCode.none
            except TqError as exc:
                code = error_code_of(exc)
        results = [{"name": t.name, "results_by_partition": [
            {"partition_index": p, "partition_error_code": code} for p in t.partitions]}
            for t in request.v3_and_below_topics]
        return build_response(ApiKey.ADD_PARTITIONS_TO_TXN, ctx.api_version, {
            "throttle_time": 0, "results_by_topic_v3_and_below": results})

    async def add_offsets_to_txn(self, ctx: RequestContext, request: Any) -> Any:
        code = await self._refusal(request.transactional_id)
        if code is None:
            try:
                # The group is claimed (DESIGN §12) only for the transaction's own producer.
                await self.backend.transactions.check(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    ctx.principal)
                if not await self.backend.authorize_group(request.group_id, ctx.principal,
                                                          claim=True):
                    code = ErrorCode.group_authorization_failed
                else:
                    await self.backend.transactions.add_offsets(
                        request.transactional_id, request.producer_id,
                        request.producer_epoch, request.group_id, ctx.principal)
                    code = ErrorCode.none
            except TqError as exc:
                code = error_code_of(exc)
        return build_response(ApiKey.ADD_OFFSETS_TO_TXN, ctx.api_version,
                              {"throttle_time": 0, "error_code": code})

    async def end_txn(self, ctx: RequestContext, request: Any) -> Any:
        code = await self._refusal(request.transactional_id)
        if code is None:
            try:
                await self.backend.transactions.end_txn(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    request.committed, ctx.principal)
                code = ErrorCode.none
            except TqError as exc:
                code = error_code_of(exc)
        return build_response(ApiKey.END_TXN, ctx.api_version,
                              {"throttle_time": 0, "error_code": code})

    async def txn_offset_commit(self, ctx: RequestContext, request: Any) -> Any:
        code = await self._refusal(request.group_id)
        if code is None:
            offsets = [CommittedOffset(t.name, p.partition_index, p.committed_offset,
                                       getattr(p, "committed_leader_epoch", -1),
                                       p.committed_metadata or "")
                       for t in request.topics for p in t.partitions]
            try:
                # AddOffsetsToTxn claimed the group, if anyone could: nothing to claim here
                if not await self.backend.authorize_group(request.group_id, ctx.principal,
                                                          claim=False):
                    code = ErrorCode.group_authorization_failed
                else:
                    await self.backend.transactions.txn_offset_commit(
                        request.transactional_id, request.producer_id,
                        request.producer_epoch, request.group_id, offsets, ctx.principal)
                    code = ErrorCode.none
            except TqError as exc:
                code = error_code_of(exc)
        topics = [{"name": t.name, "partitions": [
            {"partition_index": p.partition_index, "error_code": code} for p in t.partitions]}
            for t in request.topics]
        return build_response(ApiKey.TXN_OFFSET_COMMIT, ctx.api_version,
                              {"throttle_time": 0, "topics": topics})
