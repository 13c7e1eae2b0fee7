# A stand-in for CANN's /usr/local/Ascend/ascend-toolkit/set_env.sh in the docker-runtime test's image (CPU):
# the real one exports the toolkit's paths, without which torch_npu cannot load. This exports the same variable
# names (pointing nowhere real) and a marker, so a test can see which processes the CANN environment reached.
# Simulated tier only: never in the rollout8 image, which installs the real toolkit.
export ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest
export ASCEND_OPP_PATH=${ASCEND_TOOLKIT_HOME}/opp
export LD_LIBRARY_PATH=${ASCEND_TOOLKIT_HOME}/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}
export ROLLOUT8_CANN_STANDIN=1
