-- Argo CD health of a wok.dev InferenceService, read from the conditions its operator writes
-- (docs/gitops.md). Lua 5.1, as Argo CD's gopher-lua runs it; `obj` is the resource.
local function condition(status, kind)
  for _, c in ipairs(status.conditions or {}) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function said(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local hs = {}
local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the wok operator to reconcile the service"
  return hs
end

-- A spec the operator refused: nothing is deployed for it until it changes.
local degraded = condition(status, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = (degraded.reason or "Degraded") .. ": " .. said(degraded, "the spec was refused")
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the wok operator to reconcile generation " .. tostring(generation)
  return hs
end

-- A container that cannot run (an image that never pulls, a server that keeps crashing) does not
-- mend itself: the operator names the pod and the reason.
local failing = condition(status, "PodsFailing")
if failing ~= nil and failing.status == "True" then
  hs.status = "Degraded"
  hs.message = "A runtime pod cannot run: " .. said(failing, "a container is failing")
  return hs
end

local ready = condition(status, "Ready")
local progressing = condition(status, "Progressing")
local pending = condition(status, "PodsPending")
local serving = ready ~= nil and ready.status == "True"

-- No pod serves and some are stuck past their start: not on their way (a bad node, an image
-- that never pulls).
if not serving and pending ~= nil and pending.status == "True" and pending.reason == "PendingPastPodStart" then
  hs.status = "Degraded"
  hs.message = "No runtime pod is ready: " .. said(pending, "pods pending past their start")
  return hs
end

-- The law scaled the service to zero (minReplicas 0, or an external owner set 0 replicas).
if status.replicas == 0 and (status.readyReplicas or 0) == 0 and ready ~= nil then
  hs.status = "Healthy"
  hs.message = "Scaled to zero"
  return hs
end

if serving and (progressing == nil or progressing.status ~= "True") then
  hs.status = "Healthy"
  hs.message = said(ready, "Ready")
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = said(ready, "Waiting for the runtime pods")
else
  hs.message = said(progressing, "Waiting for the runtime pods")
end
return hs
