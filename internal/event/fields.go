package event

// The top-level event fields of the ingestion document's Event table that
// have a type the relay checks. Unknown fields are allowed and not looked at.
// Parse records the values of the first ones, up to lastRecorded; of the
// others only the type matters.
const (
	fUserID = iota
	fDeviceID
	fEventType
	fTime
	fInsertID
	fIP
	fEventProperties
	fUserProperties
	fGroupProperties
	fGroups
	fPlan
	fSessionID
	fEventID
	fQuantity
	fPrice
	fRevenue
	fLocationLat
	fLocationLng
	fSkipUserPropertiesSync
	fUserAgent
	fAppVersion
	fPlatform
	fOSName
	fOSVersion
	fDeviceBrand
	fDeviceManufacturer
	fDeviceModel
	fCarrier
	fCountry
	fRegion
	fCity
	fDMA
	fLanguage
	fProductID
	fRevenueType
	fCurrency
	fIDFA
	fIDFV
	fAndroidAppSetID
	fADID
	fAndroidID
	numFields

	lastRecorded = fIP
)

// Value kinds of the Event table.
const (
	kString   = iota // string
	kInt             // integer (JSON number without fraction or exponent, in int64)
	kNumber          // float: any JSON number
	kObject          // object
	kPropTree        // object whose nesting is at most maxPropDepth
	kBool            // boolean
)

// maxPropDepth is the Limits table's "Object depth: event_properties,
// user_properties: 40 layers". The property object itself is layer 1; every
// object or array nested in it adds a layer.
const maxPropDepth = 40

// fieldNames are the names the error body uses (the event field names).
var fieldNames = [numFields]string{
	fUserID:                 "user_id",
	fDeviceID:               "device_id",
	fEventType:              "event_type",
	fTime:                   "time",
	fInsertID:               "insert_id",
	fIP:                     "ip",
	fEventProperties:        "event_properties",
	fUserProperties:         "user_properties",
	fGroupProperties:        "group_properties",
	fGroups:                 "groups",
	fPlan:                   "plan",
	fSessionID:              "session_id",
	fEventID:                "event_id",
	fQuantity:               "quantity",
	fPrice:                  "price",
	fRevenue:                "revenue",
	fLocationLat:            "location_lat",
	fLocationLng:            "location_lng",
	fSkipUserPropertiesSync: "$skip_user_properties_sync",
	fUserAgent:              "user_agent",
	fAppVersion:             "app_version",
	fPlatform:               "platform",
	fOSName:                 "os_name",
	fOSVersion:              "os_version",
	fDeviceBrand:            "device_brand",
	fDeviceManufacturer:     "device_manufacturer",
	fDeviceModel:            "device_model",
	fCarrier:                "carrier",
	fCountry:                "country",
	fRegion:                 "region",
	fCity:                   "city",
	fDMA:                    "dma",
	fLanguage:               "language",
	fProductID:              "productId",
	fRevenueType:            "revenueType",
	fCurrency:               "currency",
	fIDFA:                   "idfa",
	fIDFV:                   "idfv",
	fAndroidAppSetID:        "android_app_set_id",
	fADID:                   "adid",
	fAndroidID:              "android_id",
}

// fieldKinds are the types of the Event table.
var fieldKinds = [numFields]uint8{
	fTime:                   kInt,
	fEventProperties:        kPropTree,
	fUserProperties:         kPropTree,
	fGroupProperties:        kObject, // not depth limited: the Limits table names only the two above
	fGroups:                 kObject,
	fPlan:                   kObject,
	fSessionID:              kInt,
	fEventID:                kInt,
	fQuantity:               kInt,
	fPrice:                  kNumber,
	fRevenue:                kNumber,
	fLocationLat:            kNumber,
	fLocationLng:            kNumber,
	fSkipUserPropertiesSync: kBool,
	// every other field is kString (0)
}

// lookupField returns the field named by key (unescaped), or -1.
func lookupField(key []byte) int {
	switch string(key) {
	case "user_id":
		return fUserID
	case "device_id":
		return fDeviceID
	case "event_type":
		return fEventType
	case "time":
		return fTime
	case "insert_id":
		return fInsertID
	case "ip":
		return fIP
	case "event_properties":
		return fEventProperties
	case "user_properties":
		return fUserProperties
	case "group_properties":
		return fGroupProperties
	case "groups":
		return fGroups
	case "plan":
		return fPlan
	case "session_id":
		return fSessionID
	case "event_id":
		return fEventID
	case "quantity":
		return fQuantity
	case "price":
		return fPrice
	case "revenue":
		return fRevenue
	case "location_lat":
		return fLocationLat
	case "location_lng":
		return fLocationLng
	case "$skip_user_properties_sync":
		return fSkipUserPropertiesSync
	case "user_agent":
		return fUserAgent
	case "app_version":
		return fAppVersion
	case "platform":
		return fPlatform
	case "os_name":
		return fOSName
	case "os_version":
		return fOSVersion
	case "device_brand":
		return fDeviceBrand
	case "device_manufacturer":
		return fDeviceManufacturer
	case "device_model":
		return fDeviceModel
	case "carrier":
		return fCarrier
	case "country":
		return fCountry
	case "region":
		return fRegion
	case "city":
		return fCity
	case "dma":
		return fDMA
	case "language":
		return fLanguage
	case "productId":
		return fProductID
	case "revenueType":
		return fRevenueType
	case "currency":
		return fCurrency
	case "idfa":
		return fIDFA
	case "idfv":
		return fIDFV
	case "android_app_set_id":
		return fAndroidAppSetID
	case "adid":
		return fADID
	case "android_id":
		return fAndroidID
	}
	return -1
}

// maxFieldLen is the longest field name; an escaped key whose value would be
// longer names no field.
const maxFieldLen = len("$skip_user_properties_sync")
