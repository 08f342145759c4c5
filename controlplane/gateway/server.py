"""The gRPC server of the device gateway.

This release serves the protocol's service so that daemons get a clear, typed answer; pairing
and the Connect stream are not implemented yet and say so with UNIMPLEMENTED.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from controlplane.services import Service
from controlplane.settings import GrpcSettings
from superagent_proto.v1 import endpoint_pb2, endpoint_pb2_grpc

log = logging.getLogger(__name__)

_NOT_YET = "this control plane does not accept devices yet (device gateway not implemented)"


class EndpointGateway(endpoint_pb2_grpc.EndpointGatewayServicer):
    async def Pair(
        self, request: endpoint_pb2.PairRequest, context: grpc.aio.ServicerContext
    ) -> endpoint_pb2.PairResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NOT_YET)
        raise AssertionError("unreachable")

    async def Connect(
        self,
        request_iterator: AsyncIterator[endpoint_pb2.DeviceMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[endpoint_pb2.ServerMessage]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NOT_YET)
        yield endpoint_pb2.ServerMessage()  # pragma: no cover - abort raises


class GatewayService(Service):
    name = "grpc"

    def __init__(self, settings: GrpcSettings) -> None:
        super().__init__()
        self.settings = settings
        self.port: int | None = None

    async def run(self) -> None:
        server = grpc.aio.server(
            options=[
                # Proxies drop idle HTTP/2 streams; keepalive pings keep them open.
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.max_pings_without_data", 0),
                ("grpc.keepalive_permit_without_calls", 1),
            ]
        )
        endpoint_pb2_grpc.add_EndpointGatewayServicer_to_server(EndpointGateway(), server)
        self.port = server.add_insecure_port(f"{self.settings.host}:{self.settings.port}")
        await server.start()
        log.info("device gateway listening on %s:%d", self.settings.host, self.port)
        try:
            await self.stopping.wait()
        finally:
            await server.stop(grace=1.0)
