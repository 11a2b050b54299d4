from protos import frontend_pb2 as _frontend_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerMessage(_message.Message):
    __slots__ = ("registration", "result")
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    registration: Registration
    result: StepResult
    def __init__(self, registration: _Optional[_Union[Registration, _Mapping]] = ..., result: _Optional[_Union[StepResult, _Mapping]] = ...) -> None: ...

class Registration(_message.Message):
    __slots__ = ("worker_id", "model_name", "model_path", "kind", "block_size", "num_blocks", "max_model_len", "vocab_size", "eos_token_ids", "auth_token", "embedding_size", "max_steps_per_plan", "tokenizer_path", "num_labels")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    AUTH_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_PER_PLAN_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_PATH_FIELD_NUMBER: _ClassVar[int]
    NUM_LABELS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    model_name: str
    model_path: str
    kind: _frontend_pb2.ModelKind
    block_size: int
    num_blocks: int
    max_model_len: int
    vocab_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    auth_token: str
    embedding_size: int
    max_steps_per_plan: int
    tokenizer_path: str
    num_labels: int
    def __init__(self, worker_id: _Optional[str] = ..., model_name: _Optional[str] = ..., model_path: _Optional[str] = ..., kind: _Optional[_Union[_frontend_pb2.ModelKind, str]] = ..., block_size: _Optional[int] = ..., num_blocks: _Optional[int] = ..., max_model_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., auth_token: _Optional[str] = ..., embedding_size: _Optional[int] = ..., max_steps_per_plan: _Optional[int] = ..., tokenizer_path: _Optional[str] = ..., num_labels: _Optional[int] = ...) -> None: ...

class BlockHash(_message.Message):
    __slots__ = ("block_id", "hash")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    hash: bytes
    def __init__(self, block_id: _Optional[int] = ..., hash: _Optional[bytes] = ...) -> None: ...

class NewRequest(_message.Message):
    __slots__ = ("request_id", "token_ids", "block_ids", "num_computed_tokens", "num_scheduled_tokens", "num_prompt_tokens", "sampling", "claimed", "written", "embed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_SCHEDULED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    EMBED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    num_computed_tokens: int
    num_scheduled_tokens: int
    num_prompt_tokens: int
    sampling: _frontend_pb2.SamplingParams
    claimed: _containers.RepeatedCompositeFieldContainer[BlockHash]
    written: _containers.RepeatedCompositeFieldContainer[BlockHash]
    embed: EmbedParams
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., block_ids: _Optional[_Iterable[int]] = ..., num_computed_tokens: _Optional[int] = ..., num_scheduled_tokens: _Optional[int] = ..., num_prompt_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_frontend_pb2.SamplingParams, _Mapping]] = ..., claimed: _Optional[_Iterable[_Union[BlockHash, _Mapping]]] = ..., written: _Optional[_Iterable[_Union[BlockHash, _Mapping]]] = ..., embed: _Optional[_Union[EmbedParams, _Mapping]] = ...) -> None: ...

class EmbedParams(_message.Message):
    __slots__ = ("normalize", "dimensions", "type_start")
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    TYPE_START_FIELD_NUMBER: _ClassVar[int]
    normalize: bool
    dimensions: int
    type_start: int
    def __init__(self, normalize: _Optional[bool] = ..., dimensions: _Optional[int] = ..., type_start: _Optional[int] = ...) -> None: ...

class ContinueRequest(_message.Message):
    __slots__ = ("request_id", "new_block_ids", "num_computed_tokens", "num_scheduled_tokens", "written", "draft_token_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_SCHEDULED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    new_block_ids: _containers.RepeatedScalarFieldContainer[int]
    num_computed_tokens: int
    num_scheduled_tokens: int
    written: _containers.RepeatedCompositeFieldContainer[BlockHash]
    draft_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., new_block_ids: _Optional[_Iterable[int]] = ..., num_computed_tokens: _Optional[int] = ..., num_scheduled_tokens: _Optional[int] = ..., written: _Optional[_Iterable[_Union[BlockHash, _Mapping]]] = ..., draft_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("step_id", "new_requests", "continuing", "dropped_request_ids", "then")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CONTINUING_FIELD_NUMBER: _ClassVar[int]
    DROPPED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    THEN_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    new_requests: _containers.RepeatedCompositeFieldContainer[NewRequest]
    continuing: _containers.RepeatedCompositeFieldContainer[ContinueRequest]
    dropped_request_ids: _containers.RepeatedScalarFieldContainer[str]
    then: _containers.RepeatedCompositeFieldContainer[Plan]
    def __init__(self, step_id: _Optional[int] = ..., new_requests: _Optional[_Iterable[_Union[NewRequest, _Mapping]]] = ..., continuing: _Optional[_Iterable[_Union[ContinueRequest, _Mapping]]] = ..., dropped_request_ids: _Optional[_Iterable[str]] = ..., then: _Optional[_Iterable[_Union[Plan, _Mapping]]] = ...) -> None: ...

class SampledToken(_message.Message):
    __slots__ = ("request_id", "token_id", "logprob", "num_accepted", "accepted_logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_id: int
    logprob: _frontend_pb2.TokenLogprob
    num_accepted: int
    accepted_logprobs: _containers.RepeatedCompositeFieldContainer[_frontend_pb2.TokenLogprob]
    def __init__(self, request_id: _Optional[str] = ..., token_id: _Optional[int] = ..., logprob: _Optional[_Union[_frontend_pb2.TokenLogprob, _Mapping]] = ..., num_accepted: _Optional[int] = ..., accepted_logprobs: _Optional[_Iterable[_Union[_frontend_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

class PromptLogprobs(_message.Message):
    __slots__ = ("request_id", "start", "entries")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    start: int
    entries: _containers.RepeatedCompositeFieldContainer[_frontend_pb2.TokenLogprob]
    def __init__(self, request_id: _Optional[str] = ..., start: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[_frontend_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

class RequestError(_message.Message):
    __slots__ = ("request_id", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    message: str
    def __init__(self, request_id: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class RequestEmbedding(_message.Message):
    __slots__ = ("request_id", "values")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, request_id: _Optional[str] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("step_id", "sampled", "errors", "embeddings", "stale_request_ids", "stored", "removed_block_ids", "all_cleared", "step_seconds", "prompt_logprobs", "then", "deferred_request_ids")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    STALE_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_CLEARED_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    THEN_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    sampled: _containers.RepeatedCompositeFieldContainer[SampledToken]
    errors: _containers.RepeatedCompositeFieldContainer[RequestError]
    embeddings: _containers.RepeatedCompositeFieldContainer[RequestEmbedding]
    stale_request_ids: _containers.RepeatedScalarFieldContainer[str]
    stored: _containers.RepeatedCompositeFieldContainer[BlockHash]
    removed_block_ids: _containers.RepeatedScalarFieldContainer[int]
    all_cleared: bool
    step_seconds: float
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[PromptLogprobs]
    then: _containers.RepeatedCompositeFieldContainer[StepResult]
    deferred_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, step_id: _Optional[int] = ..., sampled: _Optional[_Iterable[_Union[SampledToken, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[RequestError, _Mapping]]] = ..., embeddings: _Optional[_Iterable[_Union[RequestEmbedding, _Mapping]]] = ..., stale_request_ids: _Optional[_Iterable[str]] = ..., stored: _Optional[_Iterable[_Union[BlockHash, _Mapping]]] = ..., removed_block_ids: _Optional[_Iterable[int]] = ..., all_cleared: _Optional[bool] = ..., step_seconds: _Optional[float] = ..., prompt_logprobs: _Optional[_Iterable[_Union[PromptLogprobs, _Mapping]]] = ..., then: _Optional[_Iterable[_Union[StepResult, _Mapping]]] = ..., deferred_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...
