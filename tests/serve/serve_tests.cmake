# The HTTP tests of `epmoe serve`: real clients against a real server on loopback, each test
# starting its own server(s) on free ports (tests/serve/serve_harness.py). Bounded in count and
# time: every request has a timeout and every server a start and stop deadline.
set(EPMOE_SERVE_TEST_ENV
  "EPMOE_BINARY=$<TARGET_FILE:epmoe>;EPMOE_TEST_DATA=${EPMOE_TEST_DATA};EPMOE_SERVE_WORK=${CMAKE_CURRENT_BINARY_DIR}/serve-work;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
set(EPMOE_SERVE_DIR ${CMAKE_CURRENT_SOURCE_DIR}/serve)
# Debian's python3 (python3-httpx, python3-aiohttp), whatever python3 comes first on PATH.
set(EPMOE_PYTHON /usr/bin/python3)

# The OpenAI SDK (npm `openai` v6, installed by scripts/install-deps.sh) as an application uses it.
add_test(NAME serve.openai_client
         COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/serve_harness.py -- node ${EPMOE_SERVE_DIR}/openai_client_test.mjs)
# The Vercel AI SDK (npm `ai` + `@ai-sdk/openai`): the Responses API (its default) and chat
# completions, generateText and streamText, the same greedy text on both routes.
add_test(NAME serve.ai_sdk
         COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/serve_harness.py -- node ${EPMOE_SERVE_DIR}/ai_sdk_test.mjs)
# slime's and AReaL's sglang clients: their payloads and parsing (httpx, aiohttp).
add_test(NAME serve.rl_clients COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/rl_clients_test.py)
# The on-policy guarantee over HTTP: alone == among 32 concurrent, 1 and 3 ranks x every backend;
# re-scoring gives the same bits.
add_test(NAME serve.guarantee COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/guarantee_test.py)
# Hostile HTTP: bad inputs, a slow client, 200 dropped connections, a stream cut mid-way.
add_test(NAME serve.hostile COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/hostile_test.py)
# Under mpirun: a rank that dies ends the server with a message naming it, never a hang.
add_test(NAME serve.rank_failure COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/rank_failure_test.py)
# Routing replay (return_routed_experts, httpx): shape, re-score == rollout, batch and 3 ranks == alone.
add_test(NAME serve.routing_replay COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/routing_replay_test.py)
# return_token_ids on the OpenAI routes and /v1/loads (httpx).
add_test(NAME serve.rl_fields COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/rl_fields_test.py)
# Weight sync from a trainer process without disk (/update_weights_from_safetensors), 1 and 3 ranks.
add_test(NAME serve.weight_sync COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/weight_sync_test.py)
# Weight sync from a colocated trainer by CUDA IPC handles (/update_weights_from_tensor): the body's
# refusals everywhere; with torch and a GPU (EPMOE_SERVE_DEVICE=cuda) the trainer's update itself.
add_test(NAME serve.weight_sync_ipc COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/weight_sync_ipc_test.py)
# /pause_generation mode retract: continued requests == never paused (bits), 1 and 3 ranks.
add_test(NAME serve.retract COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/retract_test.py)
# Issue 38: every field of sglang's and OpenAI's request schemas implemented or refused by name;
# /tokenize, /detokenize, /v1/models/{id}, CORS, seeds, shortest log-probs, streams' last chunks (httpx).
add_test(NAME serve.fields COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/fields_test.py)

# Data-parallel attention: 2 and 3 ranks x every backend == 1 rank; orders reach the rank holding
# a request; an update while paused in place (httpx).
add_test(NAME serve.dp_attention COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/dp_attention_test.py)

# Penalties, logit_bias, min_new_tokens: their effects, the model's log-probs, the same bits (httpx).
add_test(NAME serve.sampling_fields COMMAND ${EPMOE_PYTHON} ${EPMOE_SERVE_DIR}/sampling_fields_test.py)

set_tests_properties(serve.openai_client serve.ai_sdk serve.dp_attention serve.sampling_fields serve.rl_clients serve.guarantee serve.hostile serve.rank_failure
  serve.routing_replay serve.rl_fields serve.weight_sync serve.weight_sync_ipc serve.retract serve.fields
  PROPERTIES ENVIRONMENT "${EPMOE_SERVE_TEST_ENV}" TIMEOUT 600 LABELS serve)
