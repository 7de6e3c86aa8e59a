# The signer and its grant were made without `count` before `signer` could turn them off: a
# deployment's objects keep their place at index 0.
moved {
  from = google_service_account.signer
  to   = google_service_account.signer[0]
}

moved {
  from = google_storage_bucket_iam_member.signer
  to   = google_storage_bucket_iam_member.signer[0]
}
