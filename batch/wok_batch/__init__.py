"""`wok batch`: offline work in the OpenAI Batch file format, sent to a live wok service.

Pure Python plus httpx and tqdm: the client runs in any image (a Job next to the service), so it
never needs torch, kopf or the runtime itself.
"""
